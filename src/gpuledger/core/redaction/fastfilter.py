"""The line filter (core/redaction/search.py) at C speed: Hyperscan finds the lines the filter's
reference regex finds, several times faster, when the ``hyperscan`` package is installed.

Python's regex engine tries the filter's trie at every byte of the output (about 3 ns a byte
whatever the trie: 0.4 s of CPU for 50 MB of training output); Hyperscan matches all its entries
at once, with SIMD scans for their literal starts (about 0.07 s for the same 50 MB, the Python
callback for each match included). Each entry (a keyword, or an anchor's first words and the rest
of its regex) is one Hyperscan expression; the scan gives where matches end, and search.py turns
those into the reference's lines. (Expressions running on to their line's end would report each
line once, but take 0.09 s to compile instead of 0.01 s, more than they save below ~100 MB. A
keyword of one repeated byte, ``--``, runs on to the first other byte: a rule of dashes then
reports once, not at each byte.)
``present_finder`` answers which keywords occur in a text, each reported once.

The filter's entries are matched against the lower-cased text. Where no entry can match an
upper-case ASCII letter (``case_blind``: the default rules' keywords and anchors), Hyperscan
matches them caselessly instead, on the text as it is, with the same ends: the relay then does
not lower-case every batch of output (0.02 s per 50 MB) before the scan.

Only filters whose meaning cannot change are compiled: no entry may reach past its own line (the
reference would then extend the found range to a later line), checked on the parsed regex; an
entry Hyperscan does not take makes the whole filter the reference's. Where ``hyperscan`` has no
wheel (it is a dependency on x86-64 Linux only), the reference regex does the work: same lines.
tests/test_redaction_fast_filter.py checks both give the same ranges on generated output.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from gpuledger.core.hyperscan_cache import compile_database
from gpuledger.core.hyperscan_lib import hyperscan as _hyperscan

try:  # Python 3.11+ names the regex parser re._parser; 3.10 has only sre_parse
    import re._parser as _sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_parse  # type: ignore[no-redef]


MatchEnds = Callable[[bytes], list[int]]  # where matches of any entry end, sorted, each once
_EOL_BYTES = (0x0A, 0x0D)
_LINE_SAFE_CATEGORIES = frozenset({"CATEGORY_DIGIT", "CATEGORY_WORD"})  # \d, \w: never a line end


def match_ends_finder(entries: Sequence[tuple[bytes, bytes | None]]) -> MatchEnds | None:
    """A finder of where matches of ``entries`` (first words, and the rest of an anchor's regex or
    None) end; None when Hyperscan is missing or an entry cannot be compiled with the same
    meaning (it could reach past its line, or Hyperscan does not support it)."""
    hs = _hyperscan()
    if hs is None or not entries:
        return None
    expressions = []
    for literal, rest in entries:
        tail = rest or b""
        if not literal or any(b in _EOL_BYTES or b == 0 for b in literal) or not stays_on_its_line(tail):
            return None
        expression = _literal(literal) + b"(?:" + tail + b")"
        if rest is None and len(set(literal)) == 1:  # "--": a rule of dashes reports at its end, not at each byte
            expression += b"(?:[^%s]|\\z)" % _literal(literal[:1])
        expressions.append(expression)
    # The run-on after a rule of dashes repeats the literal's byte: judged with the literal.
    caseless = all(not any(b in _UPPER for b in literal) and case_blind(rest or b"") for literal, rest in entries)
    flags = [hs.HS_FLAG_CASELESS if caseless else 0] * len(expressions)
    try:
        database = compile_database(hs.HS_MODE_BLOCK, expressions, flags)
    except hs.error:  # a construct it does not support (a look-behind), or a CPU it does not run on
        return None
    return _Finder(database, caseless)


def present_finder(keywords: frozenset[bytes]) -> Callable[[bytes], frozenset[bytes]] | None:
    """A finder of which ``keywords`` occur in a text (each reported once: Hyperscan's single-match
    flag), or None without Hyperscan."""
    words = sorted(k for k in keywords if k)
    hs = _hyperscan()
    if hs is None or not words or any(0 in k for k in words):
        return None
    try:
        database = compile_database(
            hs.HS_MODE_BLOCK, [_literal(k) for k in words], [hs.HS_FLAG_SINGLEMATCH] * len(words)
        )
    except hs.error:  # a CPU it does not run on
        return None
    local = threading.local()

    def present(low: bytes) -> frozenset[bytes]:
        scratch = getattr(local, "scratch", None)
        if scratch is None:
            scratch = local.scratch = database_scratch(database)
        found: list[int] = []
        _scan(database, low, lambda i, *_: found.append(i), scratch)
        return frozenset(words[i] for i in found)

    return present


def _literal(word: bytes) -> bytes:
    return b"".join(b"\\x%02x" % b for b in word)


class _Finder:
    """Scans with one Hyperscan database; each thread gets its own scratch space (a scratch may
    serve one scan at a time), a forked relay the copy of its parent's. ``caseless``: it finds
    in a text as it is the ends it finds in that text lower-cased (see ``case_blind``)."""

    def __init__(self, database: object, caseless: bool = False) -> None:
        self._database = database
        self.caseless = caseless
        self._local = threading.local()

    def __call__(self, low: bytes) -> list[int]:
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = database_scratch(self._database)
        ends: list[int] = []
        add = ends.append

        def on_match(_id: int, _start: int, end: int, _flags: int, _context: object) -> None:
            add(end)

        _scan(self._database, low, on_match, scratch)
        return sorted(set(ends))  # Hyperscan promises no order across expressions


class ScanError(Exception):
    """A Hyperscan scan failed (its memory, a damaged scratch): the caller uses the reference."""


def _scan(database: object, data: bytes, on_match: Callable[..., object], scratch: object) -> None:
    hs = _hyperscan()
    assert hs is not None
    try:
        database.scan(data, match_event_handler=on_match, scratch=scratch)  # type: ignore[attr-defined]
    except hs.error as exc:
        raise ScanError(f"hyperscan: {exc!r}") from exc


def stays_on_its_line(source: bytes) -> bool:
    """Whether no match of the regex ``source`` can hold a ``\\r`` or ``\\n`` (judged on its
    parsed form; anything not understood counts as able to)."""
    try:
        parsed = _sre_parse.parse(source)
    except Exception:  # re.error, or a parser of another Python version
        return False
    return _items_stay(list(parsed))


def _items_stay(items: list) -> bool:
    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            if av in _EOL_BYTES:
                return False
        elif name == "IN":
            if not _class_stays(av):
                return False
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            if not _items_stay(list(av[2])):
                return False
        elif name in ("SUBPATTERN", "ATOMIC_GROUP"):
            if not _items_stay(list(av[-1])):
                return False
        elif name == "BRANCH":
            if not all(_items_stay(list(branch)) for branch in av[1]):
                return False
        elif name != "AT":  # anchors match no byte; NOT_LITERAL, ANY, back references ... may
            return False
    return True


def case_blind(source: bytes) -> bool:
    """Whether matching the regex ``source`` caselessly (ASCII, as Hyperscan's HS_FLAG_CASELESS
    does) in a text finds exactly what matching it as written finds in that text lower-cased.

    True when no part of it can match an upper-case ASCII letter and no flag changes case
    matching inside it: then each byte of the text matches a part caselessly exactly when the
    byte lower-cased matches it (a lower-case letter in either case, any other byte as it is;
    ``\\w``, ``\\d``, ``\\s``, ``.`` and ``\\b`` treat both cases alike). Judged on the parsed form;
    anything not understood counts as not."""
    try:
        parsed = _sre_parse.parse(source)
    except Exception:  # re.error, or a parser of another Python version
        return False
    if getattr(getattr(parsed, "state", None), "flags", None) != 0:  # (?i) and the like, or unknown
        return False
    return _items_blind(list(parsed))


_UPPER = range(0x41, 0x5B)  # A-Z


def _items_blind(items: list) -> bool:
    for op, av in items:
        name = str(op)
        if name in ("LITERAL", "NOT_LITERAL"):  # "a" or "[^a]": also "A" or neither "a" nor "A"
            if av in _UPPER:
                return False
        elif name == "IN":
            if not _class_blind(av):
                return False
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            if not _items_blind(list(av[2])):
                return False
        elif name == "SUBPATTERN":
            if av[1] or av[2] or not _items_blind(list(av[-1])):  # (?i:...) / (?-i:...): flags inside
                return False
        elif name == "ATOMIC_GROUP":
            if not _items_blind(list(av)):
                return False
        elif name == "BRANCH":
            if not all(_items_blind(list(branch)) for branch in av[1]):
                return False
        elif name not in ("AT", "ANY"):  # back references and anything else: not judged
            return False
    return True


def _class_blind(items: list) -> bool:
    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            if av in _UPPER:
                return False
        elif name == "RANGE":
            low, high = av
            if low <= _UPPER[-1] and high >= _UPPER[0]:
                return False
        elif name not in ("CATEGORY", "NEGATE"):  # \\d \\w \\s and their negations: both cases alike
            return False
    return True


def _class_stays(items: list) -> bool:
    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            if av in _EOL_BYTES:
                return False
        elif name == "RANGE":
            low, high = av
            if any(low <= b <= high for b in _EOL_BYTES):
                return False
        elif name == "CATEGORY":
            if str(av) not in _LINE_SAFE_CATEGORIES:
                return False
        else:  # NEGATE and anything else
            return False
    return True


def database_scratch(database: object) -> object:
    """Scratch space for scans of ``database`` (one scan at a time may use it)."""
    hs = _hyperscan()
    assert hs is not None
    return hs.Scratch(database)
