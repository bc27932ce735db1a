"""Which lines of a run's output the end-of-run reader must look at, found at C speed.

The failure explanation and the YOLO epoch parser (failures.py, logparse.py) act on a few lines of
a training's output: a line whose last ``\\r`` draw starts with a number (a progress row), with
``Epoch``, ``all``, ``Class`` or ``classes`` (table headers and results), says `` completed in``
or ``recovering from last.pt``, or holds a failure word. Every other line leaves the parser as it
was. Decoding and splitting all of them costs 0.25 s for 50 MB of output; Hyperscan finds a
superset of the lines that matter in one pass (about 0.03 s), and only those are decoded.

The superset is taken on the raw bytes, before escape sequences are removed and the text
decoded, so it errs towards more lines: a line holding an escape sequence (which could hide a
word's start or split a word) is always taken, a draw may start with any run of bytes that are
not printable ASCII (Unicode blanks, and any non-ASCII first byte may start a Unicode digit),
and the draws after the last one taken may be blank in that sense. Outputs the fast reader does
not claim to handle return None, and the caller reads every line: no Hyperscan, an OSC escape
(which may run across lines, so the screen's lines are not the raw lines), or a character that
IGNORECASE matches with ``i`` or ``s`` (failures.py lower-cases ASCII only). The failure words
are failures.py's own (failure_words.py), so a word added there is found here too.
tests/test_relay_parse.py checks the result against reading every line.
"""

from __future__ import annotations

import contextlib
import mmap
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpuledger.core.hyperscan_cache import compile_database
from gpuledger.core.hyperscan_lib import hyperscan as _hyperscan
from gpuledger.core.training import failure_words

if TYPE_CHECKING:
    from gpuledger.core.training.lineindex import LineIndex

MIN_B = 64 << 10  # a shorter output is read line by line at once (no Hyperscan to load for it)
# A draw start (the output's start, or after \r or \n), blanks in the widest sense, then the
# first byte of the first word; the rest of that draw and blank draws up to the line's end.
_DRAW = rb"(?:\A|[\r\n])[^!-~\r\n]*"
_TO_LINE_END = rb"[^\r\n]*(?:\r[^!-~\r\n]*)*(?:\n|\z)"
_FIRST_WORD = (rb"[0-9\x80-\xff]", rb"(?:Epoch|all|Class|classes)")
_PHRASES = (b" completed in", b"recovering from last.pt")
_SEQUENCES = (b"\x1b",)
_OSC = b"\x1b]"
# What the Ultralytics eval reader looks for (integrations/ultralytics/eval_postrun.py): the relay's
# scan finds it too, so that reader need not search the whole log again.
EVAL_MARKER = b"Benchmarks complete for"


_lock = threading.Lock()
_state: dict[str, object] = {}


def _literal(word: bytes) -> bytes:
    return b"".join(b"\\x%02x" % b for b in word)


def _expressions() -> tuple[list[bytes], list[int]]:
    """The expressions and their flags; ids are the list's indices. The first (ids below
    ``len(_unhandled())``) say: read every line."""
    hs = _hyperscan()
    assert hs is not None
    expressions = [_literal(seq) for seq in _unhandled()]
    expressions += [_DRAW + first + _TO_LINE_END for first in _FIRST_WORD]
    flags = [0] * len(expressions)
    for word in (*_PHRASES, *_SEQUENCES, *failure_words.WORDS):
        expressions.append(_literal(word))
        flags.append(0)
    for word in failure_words.WORDS_ANY_CASE:
        expressions.append(_literal(word))
        flags.append(hs.HS_FLAG_CASELESS)
    return expressions, flags


def _compile(mode: int, extra: tuple[bytes, ...] = ()) -> object | None:
    hs = _hyperscan()
    assert hs is not None
    expressions, flags = _expressions()
    expressions += [_literal(word) for word in extra]
    flags += [0] * len(extra)
    try:
        return compile_database(mode, expressions, flags)  # kept on disk: core/hyperscan_cache.py
    except hs.error:  # a CPU it does not run on: every line is read
        return None


def _database() -> object | None:
    """The compiled patterns, built once (about 10 ms, or read from the cache); None without Hyperscan."""
    hs = _hyperscan()
    if hs is None:
        return None
    with _lock:
        if "db" not in _state:
            _state["db"] = _compile(hs.HS_MODE_BLOCK)
        return _state["db"]


def stream_database() -> tuple[object, int, int] | None:
    """The same patterns for a stream (the relay scans the log as it writes it: lineindex.py),
    with ``EVAL_MARKER`` added last: the database, how many first ids say "read every line",
    and the marker's id. None without Hyperscan."""
    hs = _hyperscan()
    if hs is None:
        return None
    with _lock:
        if "stream" not in _state:
            _state["stream"] = _compile(hs.HS_MODE_STREAM, (EVAL_MARKER,))
        db = _state["stream"]
    if db is None:
        return None
    count = len(_expressions()[0])
    return db, len(_unhandled()), count


_local = threading.local()


def _unhandled() -> tuple[bytes, ...]:
    return (_OSC, *(c.encode() for c in failure_words.CASE_SPECIALS))


def candidate_lines(data: bytes | mmap.mmap, min_b: int = MIN_B) -> tuple[list[tuple[int, bytes]], int] | None:
    """(index, raw bytes without the ``\\n``) of each line, split at ``\\n``, that may matter to
    the end-of-run reader, in order, and how many lines there are; None when every line must be
    read (see the module doc, and outputs shorter than ``min_b``). ``data`` may be the log file
    mapped (``gpuledger run``, runs/logfile.map_whole) only while an index is attached to it."""
    if not isinstance(data, (bytes, mmap.mmap)) or not data or len(data) < min_b:
        return None
    index = _index_of(data)
    if index is not None:
        return _from_index(data, index)
    if not isinstance(data, bytes):
        return None
    db = _database()
    hs = _hyperscan()
    if db is None or hs is None:
        return None
    scratch = getattr(_local, "scratch", None)
    if scratch is None:
        scratch = _local.scratch = hs.Scratch(db)
    ends: list[int] = []
    add = ends.append
    unhandled = len(_unhandled())

    def on_match(pattern: int, _start: int, end: int, _flags: int, _context: object) -> bool:
        if pattern < unhandled:
            return True  # stop the scan: every line is read
        add(end)
        return False

    try:
        db.scan(data, match_event_handler=on_match, scratch=scratch)  # type: ignore[attr-defined]
    except hs.error:  # ScanTerminated: a line that says read them all; or Hyperscan failed
        return None
    out: list[tuple[int, bytes]] = []
    count, find, size = data.count, data.find, len(data)
    index = counted = 0  # lines before ``counted``
    line_end = -1  # the end of the last line taken
    for end in sorted(set(ends)):
        at = end - 1  # a byte of the match's line: its last byte, or the \n ending that line
        if at <= line_end:  # on the line taken last
            continue
        index += count(b"\n", counted, at)
        counted = at
        start = data.rfind(b"\n", 0, at) + 1
        line_end = find(b"\n", at)
        if line_end < 0:
            line_end = size
        out.append((index, data[start:line_end]))
    return out, index + count(b"\n", counted) + 1


# Logs whose lines the relay indexed as it wrote them (lineindex.py), by identity: ``gpuledger
# run`` attaches the index to the bytes it hands the end-of-run readers, which then neither count
# the lines nor scan the log again. Held by identity and checked with ``is``: equal bytes read
# elsewhere are scanned as before.
_attached: dict[int, tuple[bytes | mmap.mmap, LineIndex]] = {}


@contextlib.contextmanager
def attached(data: bytes | mmap.mmap | None, index: LineIndex | None) -> Iterator[None]:
    """While inside, ``candidate_lines(data)`` and ``holds_marker(data)`` answer from ``index``
    (which must describe exactly these bytes: its size is checked, the rest is trusted)."""
    if data is None or index is None or index.size != len(data):
        yield
        return
    key = id(data)
    with _lock:
        _attached[key] = (data, index)
    try:
        yield
    finally:
        with _lock:
            _attached.pop(key, None)


def _index_of(data: bytes | mmap.mmap) -> LineIndex | None:
    held = _attached.get(id(data))
    return held[1] if held is not None and held[0] is data else None


def _from_index(data: bytes | mmap.mmap, index: LineIndex) -> tuple[list[tuple[int, bytes]], int] | None:
    """What the scan above gives, from the lines the relay found: each line's bytes are cut from
    ``data`` around a byte the relay saw matched, the count is the relay's."""
    if index.every_line:
        return None
    out: list[tuple[int, bytes]] = []
    rfind, find, size = data.rfind, data.find, len(data)
    for line, at in index.pairs():
        end = find(b"\n", at)
        out.append((line, data[rfind(b"\n", 0, at) + 1 : end if end >= 0 else size]))
    return out, index.newlines + 1


def holds_marker(log: bytes | mmap.mmap) -> bool:
    """Whether ``EVAL_MARKER`` is in ``log``: the relay's answer when it indexed these bytes."""
    index = _index_of(log)
    if index is not None and index.marker is not None:
        return index.marker
    return log.find(EVAL_MARKER) >= 0


def whole(log: bytes | mmap.mmap) -> bytes:
    """The log as bytes, for a reader that needs all of it (a mapped log is copied then)."""
    return log if isinstance(log, bytes) else bytes(log)
