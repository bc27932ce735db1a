"""The end-of-run reader's lines, found by the output relay as it writes the log.

The relay (recorder/relay.py) holds every byte of the log while it writes it. ``LineIndexer``
scans those bytes, in the order written, with candidates.py's patterns compiled for a stream, and
counts their line ends: at the end of the run ``gpuledger run`` has the line count, one matched
byte of each line candidates.py would take (with the line's number) and whether the eval marker
occurs, and the end-of-run readers cut those lines out of the log instead of counting its lines
and scanning it again (candidates.attached). Stream mode reports what block mode reports on the
whole log, so the lines are the same; tests/test_relay_line_index.py checks it on generated logs
cut at random places.

No index (None) where it cannot be exact: an output shorter than ``hold_b`` (candidates.py reads
such a log line by line; nothing is compiled for it), no Hyperscan, a failed scan, a match not in
the bytes just scanned. ``every_line``: a byte sequence says every line must be read (candidates.py).
The index travels from the relay's process in a small file next to the log (``save``/``load``).
"""

from __future__ import annotations

import contextlib
import os
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from gpuledger.core.hyperscan_lib import hyperscan as _hyperscan
from gpuledger.core.training.candidates import MIN_B, stream_database

_VERSION = 1
_EVERY_LINE, _MARKER, _MARKER_KNOWN = 1, 2, 4


@dataclass
class LineIndex:
    size: int  # bytes of log scanned: the index describes exactly these
    newlines: int  # ``\n`` bytes among them
    # line number, offset of a matched byte, line number, ... (16 bytes a line: a chatty output may
    # have a million such lines), in order; ``pairs`` reads them
    lines: array = field(default_factory=lambda: array("q"))
    marker: bool | None = None  # candidates.EVAL_MARKER occurs; None: not known
    every_line: bool = False

    def pairs(self) -> Iterator[tuple[int, int]]:
        it = iter(self.lines)
        return zip(it, it, strict=True)


class LineIndexer:
    """Fed the log's bytes in order; ``close`` gives the index or None (see the module doc).
    Never raises: a problem drops the index, never the relay."""

    def __init__(self, hold_b: int = MIN_B, max_b: int | None = None) -> None:
        self._hold_b = hold_b
        self._max_b = max_b  # a longer log is stored capped and read the usual way: no index kept
        self._held: list[bytes] | None = []
        self._held_b = 0
        self._stream: object | None = None
        self._opened: object | None = None
        self._scratch: object | None = None
        self._ends: list[int] = []
        self._dead = False
        self._every_line = False
        self._marker = False
        self.size = 0
        self.newlines = 0
        self._last = b""
        self._lines = array("q")
        self._last_line = -1

    def feed(self, data: bytes) -> None:
        if self._dead or not data:
            return
        try:
            if self._held is not None:
                self._held.append(data)
                self._held_b += len(data)
                if self._held_b < self._hold_b or not self._open():
                    return
                data, self._held = b"".join(self._held), None
            self._scan(data)
            if self._max_b is not None and self.size > self._max_b:
                self._drop()
        except Exception:
            self._drop()

    def close(self) -> LineIndex | None:
        if self._dead or self._held is not None:
            self._drop()
            return None
        try:
            base = self.size - len(self._last)
            self._ends = []
            opened, self._opened = self._opened, None
            opened.__exit__(None, None, None)  # type: ignore[union-attr]  # reports matches at the end (\z)
            self._take(self._last, base, self._ends, close=True)
        except Exception:
            self._drop()
        if self._dead:
            return None
        if self._every_line:
            return LineIndex(self.size, self.newlines, array("q"), None, every_line=True)
        return LineIndex(self.size, self.newlines, self._lines, self._marker)

    def _open(self) -> bool:
        found = stream_database()
        hs = _hyperscan()
        if found is None or hs is None:
            self._drop()
            return False
        db, self._unhandled, self._marker_id = found
        self._scratch = hs.Scratch(db)
        # python-hyperscan keeps no reference to the handler: this object holds it (a bound method).
        self._handler = self._on_match
        stream = db.stream(match_event_handler=self._handler)  # type: ignore[attr-defined]
        self._opened = stream.__enter__()
        return True

    def _on_match(self, pattern: int, _start: int, end: int, _flags: int, _context: object) -> bool:
        if pattern < self._unhandled:
            self._every_line = True
            return True  # stop: every line is read
        if pattern == self._marker_id:
            self._marker = True
        else:
            self._ends.append(end)
        return False

    def _scan(self, data: bytes) -> None:
        if self._every_line:  # known already: only the size is still wanted
            self.size += len(data)
            return
        hs = _hyperscan()
        assert hs is not None
        base = self.size
        self._ends = []
        try:
            self._opened.scan(data, scratch=self._scratch)  # type: ignore[union-attr]
        except hs.error:
            if not self._every_line:  # a failed scan, not the stop asked for above
                raise
            self._opened = _Closed()
            self.size += len(data)
            return
        self._take(data, base, self._ends)
        self.size += len(data)
        self._last = data

    def _take(self, data: bytes, base: int, ends: list[int], close: bool = False) -> None:
        """Each match's line (the line of its last byte), once, in order; the line ends counted."""
        count = data.count
        before = self.newlines - (count(b"\n") if close else 0)
        counted = 0
        for end in sorted(set(ends)):
            at = end - 1 - base
            if not 0 <= at < len(data):
                raise ValueError("a match outside the bytes scanned")
            before += count(b"\n", counted, at)
            counted = at
            if before != self._last_line:
                self._lines.append(before)
                self._lines.append(base + at)
                self._last_line = before
        if not close:
            self.newlines = before + count(b"\n", counted)

    def _drop(self) -> None:
        self._dead = True
        self._held = None
        self._lines = array("q")
        opened, self._opened = self._opened, None
        if opened is not None:
            with contextlib.suppress(Exception):
                opened.__exit__(None, None, None)  # type: ignore[attr-defined]


class _Closed:
    """A stream Hyperscan stopped: nothing more to scan or report."""

    def __exit__(self, *_: object) -> None:
        return None


def save(index: LineIndex, path: str) -> None:
    """Write ``index`` to ``path`` (whole or not at all: a temporary file renamed)."""
    flags = (_EVERY_LINE if index.every_line else 0) | (
        (_MARKER_KNOWN | (_MARKER if index.marker else 0)) if index.marker is not None else 0
    )
    words = array("q", [_VERSION, index.size, index.newlines, flags, len(index.lines) // 2])
    words.extend(index.lines)
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as fh:
        words.tofile(fh)
    os.replace(tmp, path)


def load(path: str) -> LineIndex | None:
    """The index ``save`` wrote; None when there is none or it is not whole."""
    words = array("q")
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    if len(raw) % words.itemsize:
        return None
    words.frombytes(raw)
    if len(words) < 5 or words[0] != _VERSION or len(words) != 5 + 2 * words[4]:
        return None
    _, size, newlines, flags, _count = words[:5]
    marker = bool(flags & _MARKER) if flags & _MARKER_KNOWN else None
    return LineIndex(size, newlines, words[5:], marker, every_line=bool(flags & _EVERY_LINE))


def index_path(log_path: str) -> str:
    """Where the relay leaves the index of the log at ``log_path``."""
    return f"{log_path}.lines"
