"""Where the redaction engine (core/redaction/redact.py) looks: built once from the rules, so that most of a
training's output is never handed to the rules at all.

- ``line_filter``: finds the lines any rule could match in. For a rule with an anchor
  (``token["']?[ \\t]*[=:]``) that is the anchor, split into its plain first words and what
  follows, so ``tokens/s`` or ``key_dim`` in a metrics row does not make the row a candidate; for
  the other rules it is their keywords. The reference is one regex, a trie on the first words
  (Python's regex engine then tries one branch per byte); where Hyperscan is installed the same
  entries are matched by it, several times faster, with the same lines found (fastfilter.py).
- ``text_lines``: the same lines of a text not lower-cased yet, lower-casing it only when the
  filter's Hyperscan cannot match caselessly.
- ``present_keywords``: which keywords occur in a text, in about one pass.
- ``search_windows``: the lines one rule must search, by its anchor or keywords.
- ``anchor_parts``: an anchor starting with a choice of words as one search per word (the engine
  skips ahead to a fixed word many times faster than it tries a choice at every byte).

Every shortcut only narrows where the rules search, never what they find: a line left out holds
none of a rule's keywords (or anchor), which every match of the rule holds.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence

from gpuledger.core.redaction.fastfilter import MatchEnds, ScanError, match_ends_finder, present_finder

EOL = re.compile(rb"[\r\n]")
_EOL_BYTES = (0x0A, 0x0D)
DENSE_LINES = 256  # past this many hits, a hit on most lines means: search the whole buffer at once
FAST_MIN_B = 16 << 10  # from this size on the line filter uses Hyperscan (built on first use)
_META = frozenset(b".^$*+?{}[]|()")
_QUANTIFIERS = frozenset(b"?*+{")
# An anchor that starts with a group of plain words: (?:token|secret|key)...
_LEADING_WORDS = re.compile(rb"\(\?:((?:[A-Za-z0-9_]|\\[^A-Za-z0-9])+(?:\|(?:[A-Za-z0-9_]|\\[^A-Za-z0-9])+)*)\)")
_WORD = re.compile(rb"(?:[A-Za-z0-9_]|\\[^A-Za-z0-9])+")
_BACKREF = re.compile(rb"\\[1-9]|\(\?P=")

Search = Callable[[bytes, int], "re.Match[bytes] | None"]
_Entry = tuple[bytes, "bytes | None"]  # (first words, the rest of an anchor's regex; None: a keyword)


# -- the line filter ----------------------------------------------------------------------------


class LineFilter:
    """Finds the lines where one of a set of entries could match: ``search(low, pos)`` is the
    reference regex (a match runs from an entry to its line's end); ``match_ends()`` the same
    entries in Hyperscan (fastfilter.py), built on first use: importing and compiling it costs
    about 40 ms, which a process that never filters a large text does not pay."""

    def __init__(self, entries: list[_Entry]) -> None:
        self._kept = _kept(entries)
        self.search: Search = (
            re.compile(b"(?:" + _entries_trie(self._kept) + rb")[^\r\n]*[\r\n]?").search
            if self._kept
            else _NOTHING.search
        )
        self._fast: MatchEnds | bool | None = None  # None: not built yet; False: not available

    def __call__(self, low: bytes, pos: int) -> re.Match[bytes] | None:
        return self.search(low, pos)

    def match_ends(self) -> MatchEnds | None:
        """Hyperscan's finder of where the entries' matches end; None where it cannot be had."""
        if self._fast is None:
            self._fast = match_ends_finder(self._kept) or False
        return self._fast or None

    def give_up_fast(self) -> None:
        self._fast = False


_NOTHING = re.compile(rb"(?!)")


def line_filter(
    rules: Iterable[tuple[Sequence[bytes], re.Pattern[bytes] | None]], extra: Sequence[bytes]
) -> LineFilter:
    """The filter finding a line where one of ``rules`` (their keywords and anchor) could match,
    or holding one of ``extra``."""
    entries: list[_Entry] = [(w, None) for w in extra]
    anchored: list[_Entry] = []
    for keywords, anchor in rules:
        parts = _anchor_entries(anchor) if anchor is not None else None
        if parts is None:
            entries += [(k, None) for k in keywords]
        else:
            anchored += parts
    try:
        return LineFilter(entries + anchored)
    except re.error:  # anchors that do not combine (a group name used twice): their keywords
        return LineFilter(entries + [(k, None) for keywords, a in rules if a is not None for k in keywords])


def _kept(entries: list[_Entry]) -> list[_Entry]:
    """The entries without those found through a shorter keyword anyway, sorted."""
    words = {lit for lit, tail in entries if tail is None}
    kept = {
        (lit, tail)
        for lit, tail in entries
        if lit
        and not any(w != lit and w and w in lit for w in words)  # found through a shorter keyword
        and not (tail is not None and any(w in lit for w in words))
    }
    return sorted(kept, key=lambda e: (e[0], e[1] is not None, e[1] or b""))


def _entries_trie(entries: list[_Entry]) -> bytes:
    """Regex source matching where one of ``entries`` matches, as a trie on their first words."""
    ending = [tail for lit, tail in entries if not lit]
    if None in ending:
        return b""  # a keyword ends here: found, whatever longer entries would add
    branches: dict[bytes, list[_Entry]] = {}
    for lit, tail in entries:
        if lit:
            branches.setdefault(lit[:1], []).append((lit[1:], tail))
    alts = [b"(?:" + tail + b")" for tail in sorted(t for t in ending if t is not None)]
    alts += [re.escape(head) + _entries_trie(rest) for head, rest in sorted(branches.items())]
    return alts[0] if len(alts) == 1 else b"(?:" + b"|".join(alts) + b")"


def _anchor_entries(anchor: re.Pattern[bytes]) -> list[_Entry] | None:
    """The anchor as (first words, rest) entries; None when it does not start with plain words."""
    if anchor.flags & ~re.ASCII:
        return None
    lead = _leading_words(anchor.pattern)
    sources = [word + lead[1] for word in lead[0]] if lead else [anchor.pattern]
    entries = []
    for source in sources:
        split = _literal_and_rest(source)
        if split is None:
            return None
        entries.append(split)
    return entries


def _literal_and_rest(source: bytes) -> _Entry | None:
    """``source`` as its fixed first bytes and the regex after them; None when it has no fixed
    start, or a top-level ``|`` or a back reference (which would change meaning once embedded)."""
    if _top_level_alternation(source) or _BACKREF.search(source):
        return None
    literal = bytearray()
    ends: list[int] = []  # where each literal byte's source ends
    i = 0
    while i < len(source):
        c = source[i]
        if c == 0x5C:  # backslash: an escaped punctuation mark is a plain byte
            if i + 1 >= len(source) or chr(source[i + 1]).isalnum():
                break
            literal.append(source[i + 1])
            i += 2
        elif c in _META:
            break
        else:
            literal.append(c)
            i += 1
        ends.append(i)
    if ends and i < len(source) and source[i] in _QUANTIFIERS:
        literal.pop()  # "keys?": the quantifier makes the last byte optional
        ends.pop()
    if not literal:
        return None
    return bytes(literal), source[ends[-1] :]


def _top_level_alternation(source: bytes) -> bool:
    depth, i, in_class = 0, 0, False
    while i < len(source):
        c = source[i]
        if c == 0x5C:
            i += 2
            continue
        if in_class:
            in_class = c != 0x5D  # ]
        elif c == 0x5B:  # [, and a ] right after [ or [^ is a plain byte
            i += 2 if source[i + 1 : i + 2] == b"^" else 1
            i += 1 if source[i : i + 1] == b"]" else 0
            in_class = True
            continue
        elif c == 0x28:
            depth += 1
        elif c == 0x29:
            depth -= 1
        elif c == 0x7C and depth == 0:
            return True
        i += 1
    return False


def _leading_words(source: bytes) -> tuple[list[bytes], bytes] | None:
    m = _LEADING_WORDS.match(source)
    return (_WORD.findall(m.group(1)), source[m.end() :]) if m else None


def text_lines(text: bytes, search: LineFilter) -> list[tuple[int, int]] | None:
    """``keyword_lines`` of ``text`` lower-cased, without lower-casing it where the filter's
    Hyperscan finder matches caselessly: it then finds the same ends in ``text`` itself
    (fastfilter.case_blind), and a line's bounds are the same in both (lower-casing keeps every
    byte's place and every line end)."""
    if len(text) >= FAST_MIN_B and (ends := search.match_ends()) is not None and getattr(ends, "caseless", False):
        try:
            return lines_from_match_ends(text, ends(text))
        except ScanError:  # Hyperscan failed at run time: the reference regex, from now on
            search.give_up_fast()
    return keyword_lines(text.lower(), search)


def keyword_lines(low: bytes, search: LineFilter | Search) -> list[tuple[int, int]] | None:
    """The lines (start, end incl. terminator; adjacent ones merged) where ``search`` (a line
    filter) finds something; None when that is most lines, where searching them all at once is
    cheaper. From FAST_MIN_B bytes on, a filter's Hyperscan finds them (the same lines).

    The search resumes after each line it found, and the backward search for that line's start
    stops where it began, so every byte is looked at a bounded number of times.
    """
    if isinstance(search, LineFilter) and len(low) >= FAST_MIN_B and (ends := search.match_ends()) is not None:
        try:
            return lines_from_match_ends(low, ends(low))
        except ScanError:  # Hyperscan failed at run time: the reference regex, from now on
            search.give_up_fast()
    found = _Lines()
    rfind, pos = low.rfind, 0
    while (m := search(low, pos)) is not None:
        i, end = m.span()
        nl, cr = rfind(b"\n", pos, i), rfind(b"\r", pos, i)
        start = (nl if nl > cr else cr) + 1 or pos  # the line starts at pos when no line end comes first
        if found.add(start, end):
            return None
        pos = end
    return found.ranges()


class _Lines:
    """The lines found so far, adjacent ones merged, and whether they are most of the text: the
    bookkeeping both ways of finding them share."""

    __slots__ = ("_ranges", "covered", "hits", "run_end", "run_start")

    def __init__(self) -> None:
        self._ranges: list[tuple[int, int]] = []
        self.run_start = self.run_end = -1  # the lines found so far that follow each other
        self.covered = self.hits = 0

    def add(self, start: int, end: int) -> bool:
        """Add the line [start, end); True when the lines found are most of the text up to ``end``."""
        if start != self.run_end:
            if self.run_end >= 0:
                self._ranges.append((self.run_start, self.run_end))
            self.run_start = start
        self.run_end = end
        self.covered += end - start
        self.hits += 1
        return self.hits >= DENSE_LINES and self.covered * 2 > end

    def ranges(self) -> list[tuple[int, int]]:
        if self.run_end >= 0:
            self._ranges.append((self.run_start, self.run_end))
        return self._ranges


def lines_from_match_ends(low: bytes, ends: list[int]) -> list[tuple[int, int]] | None:
    """``keyword_lines`` from where the filter's entries match (their ends, sorted): the same
    ranges, and the same "most lines" judgement line by line. An entry never reaches past its
    line (fastfilter.py), so a match's line is the one holding its last byte."""
    found = _Lines()
    rfind, size = low.rfind, len(low)
    pos = 0  # the end of the last line found
    for to in ends:
        if low[to - 1] in _EOL_BYTES:  # an entry that runs to its line's end: the terminator is its last byte
            to -= 1
        if to <= pos:  # on a line found already
            continue
        nl, cr = rfind(b"\n", pos, to), rfind(b"\r", pos, to)
        start = (nl if nl > cr else cr) + 1 or pos
        eol = EOL.search(low, to)
        end = eol.end() if eol else size
        if found.add(start, end):
            return None
        pos = end
    return found.ranges()


# -- keywords -----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def keyword_pattern(keywords: frozenset[bytes]) -> re.Pattern[bytes]:
    """A regex finding any of ``keywords`` (as a trie: each position is tried against one branch
    per byte). Where several start at the same place it may find any of them."""
    return re.compile(_trie(sorted(w for w in keywords if w)) or rb"(?!)")


def _trie(words: Sequence[bytes]) -> bytes:
    """Regex source for the alternation of ``words`` (distinct, non-empty)."""
    if not words:
        return b""
    branches: dict[bytes, list[bytes]] = {}
    for w in words:
        branches.setdefault(w[:1], []).append(w[1:])
    alts = []
    for head, rest in sorted(branches.items()):
        longer = [r for r in rest if r]
        tail = _trie(longer)
        if tail and len(longer) < len(rest):  # a word ends here and longer ones go on
            tail = b"(?:" + tail + b")?"
        alts.append(re.escape(head) + tail)
    return alts[0] if len(alts) == 1 else b"(?:" + b"|".join(alts) + b")"


def present_keywords(keywords: frozenset[bytes], low: bytes, *, fast: bool = False) -> frozenset[bytes]:
    """Which of ``keywords`` occur in ``low``, in about one pass: by Hyperscan
    (fastfilter.present_finder) when ``fast`` or ``low`` has FAST_MIN_B bytes (the lines picked
    from a large text are often short); else search for all of them at once, drop every one that
    starts at the hit, and search on from there for the rest (nothing is missed: no keyword still
    looked for starts before the hit). Each new set of keywords left compiles a regex."""
    if (fast or len(low) >= FAST_MIN_B) and (present := _present_finder(keywords)) is not None:
        try:
            return present(low)
        except ScanError:  # Hyperscan failed at run time: the regex engine answers the same
            pass
    return reference_present_keywords(keywords, low)


@functools.lru_cache(maxsize=16)
def _present_finder(keywords: frozenset[bytes]) -> Callable[[bytes], frozenset[bytes]] | None:
    return present_finder(keywords)


def reference_present_keywords(keywords: frozenset[bytes], low: bytes) -> frozenset[bytes]:
    """``present_keywords`` with Python's regex engine."""
    left, found, pos = keywords, set(), 0
    while left and (m := keyword_pattern(left).search(low, pos)) is not None:
        pos = m.start()
        here = {k for k in left if low.startswith(k, pos)}
        found |= here
        left = left - here
    return frozenset(found)


# -- one rule's windows -------------------------------------------------------------------------


def search_windows(
    low: bytes, anchors: Sequence[re.Pattern[bytes]], keywords: Sequence[bytes]
) -> list[tuple[int, int]]:
    """The parts of the buffer a rule must search: the lines holding its anchor (``anchors``: its
    parts, see ``anchor_parts``), or else one of its keywords, adjacent lines merged; the whole
    buffer when they are on most lines anyway."""
    if anchors:
        finders: list[Callable[[int], int]] = [functools.partial(_found_at, a.search, low) for a in anchors]
    else:
        finders = [functools.partial(low.find, kw) for kw in keywords]
    found: list[tuple[int, int]] = []
    for find in finders:
        lines = lines_where(low, find)
        if lines is None:
            return [(0, len(low))]
        found += lines
    found.sort()
    merged: list[tuple[int, int]] = []
    for start, stop in found:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def _found_at(search: Search, low: bytes, pos: int) -> int:
    m = search(low, pos)
    return m.start() if m else -1


def anchor_parts(anchor: re.Pattern[bytes]) -> tuple[re.Pattern[bytes], ...]:
    """The anchor as patterns that each start with a plain word, when it starts with a choice of
    plain words: ``(?:a|b)X`` finds what ``aX`` and ``bX`` together find, and Python's regex engine
    skips ahead to a fixed first word many times faster than it tries a choice at every byte.
    Any other anchor is kept whole."""
    lead = _leading_words(anchor.pattern)
    if lead is None or len({w[:1] for w in lead[0]}) == 1:  # (?:password|passwd): it skips to "pass" already
        return (anchor,)
    try:
        return tuple(re.compile(word + lead[1], anchor.flags) for word in lead[0])
    except re.error:
        return (anchor,)


def lines_where(low: bytes, find: Callable[[int], int]) -> list[tuple[int, int]] | None:
    """The lines (start, end incl. terminator) where ``find(pos)`` finds something; None when that
    is most lines, as searching the whole buffer at once is then cheaper than line by line.

    Each search resumes after the line it found, and the backward search for a line start stops
    there, so every byte is looked at a bounded number of times, however long the line.
    """
    lines: list[tuple[int, int]] = []
    size, pos, covered = len(low), 0, 0
    while (i := find(pos)) >= 0:
        start = max(low.rfind(b"\n", pos, i), low.rfind(b"\r", pos, i), pos - 1) + 1
        eol = EOL.search(low, i)
        pos = eol.end() if eol else size
        lines.append((start, pos))
        covered += pos - start
        if len(lines) >= DENSE_LINES and covered * 2 > pos:
            return None
    return lines
