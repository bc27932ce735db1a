"""Keep secrets out of the ledger: redact command lines, labels and logs.

The rules are data (``redact_rules.toml``, shipped with the package); this module applies them.
A secret is replaced by ``[REDACTED:<rule-name>]``; the key, flag, user or host around it stays.

The engine works on bytes, so a log's binary garbage survives byte for byte except the redacted
spans, and a multi-byte character is never cut. Matches never cross a line end (``\\n`` or
``\\r``), which is what lets :class:`LineRedactor` redact a stream line by line and give exactly
what :meth:`Redactor.redact_bytes` gives for the whole input. The one thing that spans lines, a
PEM private key block, is a small state machine whose state the stream carries from line to line.

Speed (the output relay redacts everything a training prints, tens of MB): one search built once
from all the rules' keywords (a trie-shaped regex) finds the lines holding any keyword or escape
sequence; only those lines, joined, are handed to the rules, and most lines of training output (a
progress bar redrawn with ``\r``, a metrics row) hold none. Within them a rule only searches lines
holding one of its keywords, or its anchor when it has one; which keywords occur at all is found
in about one pass. ANSI colour codes are matched around (a secret split by a colour code is still
found) and are kept untouched in the output.
"""

from __future__ import annotations

import bisect
import functools
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuledger.core.redaction.search import EOL as _EOL
from gpuledger.core.redaction.search import (
    FAST_MIN_B,
    anchor_parts,
    line_filter,
    present_keywords,
    search_windows,
    text_lines,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


__all__ = ["LineRedactor", "RedactionRuleError", "Redactor", "Rule", "placeholder"]

DEFAULT_MAX_LINE_BYTES = 1 << 20
# A line longer than that is cut (LineRedactor): the bytes kept before and after a cut so that no
# secret across it escapes the rules (a key name just before it, a token just after).
CUT_CONTEXT_B = 4096
CUT_LOOKAHEAD_B = 4096

# CSI (colours, cursor moves), OSC (titles, links; ended by BEL or ST) and two-byte escapes.
# No alternative can contain \r or \n, so stripping them keeps lines intact.
_ANSI = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b\r\n]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_BASE64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
_PEM_HEADER = re.compile(rb"[ \t]*[A-Za-z][A-Za-z-]*:[ \t]")  # Proc-Type:, DEK-Info:, Comment:
_PEM_MIN_TRAILING_RUN = 16  # a log prefix, then at least this much base64: still key material

# argv items that end one program's arguments (also as the last character: `ping;`)
_COMMAND_ENDS = frozenset({"|", "||", "&&", ";", "&"})
_COMMAND_END_CHARS = (";", "|", "&")
_Span = tuple[int, int, int, bytes]  # (start, rule order, end, replacement) of one find
_Cut = tuple[int, int, bytes]  # (start, end, replacement): one redaction, after merging


class RedactionRuleError(ValueError):
    """The rules file is malformed; the message names the rule and the problem."""


def placeholder(rule_name: str) -> str:
    return f"[REDACTED:{rule_name}]"


@dataclass(frozen=True)
class Rule:
    """One redaction rule, compiled. ``kind`` is "regex", or "pem" for private key blocks."""

    name: str
    description: str
    keywords: tuple[bytes, ...]
    regex: re.Pattern[bytes] | None = None
    group: int | str = 1
    anchor: re.Pattern[bytes] | None = None  # on the lower-cased text; narrows the lines searched
    kind: str = "regex"
    begin: re.Pattern[bytes] | None = None
    end: re.Pattern[bytes] | None = None
    max_lines: int = 0
    example: str = ""
    expected: str = ""

    @property
    def replacement(self) -> bytes:
        return placeholder(self.name).encode()


@dataclass
class _State:
    """What a stream carries between lines: key lines still allowed inside an open PEM block."""

    pem_lines_left: int = 0


class Redactor:
    """Applies a set of rules. Build it once (``Redactor.default()``) and reuse it: it is immutable."""

    def __init__(
        self,
        rules: Sequence[Rule],
        *,
        argv_rule: str = "secret-flag",
        argv_flag: str | None = None,
        mapping_rule: str = "secret-key-name",
        mapping_key: str | None = None,
        program: str | None = None,
        program_flag: str = "-p",
        program_rule: str = "mysql-password",
    ) -> None:
        pem = [r for r in rules if r.kind == "pem"]
        if len(pem) > 1:
            raise RedactionRuleError("at most one rule of kind 'pem' is supported")
        self.rules: tuple[Rule, ...] = tuple(rules)
        self._regex_rules = [(order, r) for order, r in enumerate(rules) if r.kind == "regex"]
        self._anchors = {r.name: anchor_parts(r.anchor) for r in rules if r.anchor is not None}
        self._pem = (rules.index(pem[0]), pem[0]) if pem else None
        # Built once from the rules: where they can match at all (core/redaction/search.py).
        self._keywords = frozenset(k for r in rules for k in r.keywords)
        self._line_filter = line_filter([(r.keywords, r.anchor) for r in rules], extra=(b"\x1b",))
        self._argv_rule = argv_rule
        self._argv_flag = re.compile(argv_flag) if argv_flag else None
        self._mapping_rule = mapping_rule
        self._mapping_key = re.compile(mapping_key) if mapping_key else None
        self._program = re.compile(program) if program else None
        self._program_flag = program_flag
        self._program_rule = program_rule

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def default(cls) -> Redactor:
        """The rules shipped with gpuledger (``gpuledger/core/redaction/redact_rules.toml``)."""
        return _default_redactor()

    @classmethod
    def from_file(cls, path: str | Path) -> Redactor:
        """Rules from a TOML file of the same shape as the packaged one."""
        return cls.from_toml(Path(path).read_text(encoding="utf-8"))

    @classmethod
    def from_toml(cls, text: str) -> Redactor:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise RedactionRuleError(f"redaction rules are not valid TOML: {exc}") from exc
        return cls._from_doc(doc)

    @classmethod
    def _from_doc(cls, doc: Mapping[str, Any]) -> Redactor:
        fragments = {str(k): str(v) for k, v in doc.get("fragments", {}).items()}
        rules = [_compile_rule(raw, fragments) for raw in doc.get("rule", [])]
        names = [r.name for r in rules]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise RedactionRuleError(f"duplicate rule names: {', '.join(dupes)}")
        argv = doc.get("argv", {})
        mapping = doc.get("mapping", {})
        return cls(
            rules,
            argv_rule=argv.get("rule", "secret-flag"),
            argv_flag=argv.get("flag"),
            mapping_rule=mapping.get("rule", "secret-key-name"),
            mapping_key=mapping.get("key"),
            program=argv.get("program"),
            program_flag=argv.get("program_flag", "-p"),
            program_rule=argv.get("program_rule", "mysql-password"),
        )

    # -- public API -----------------------------------------------------------------------------

    def redact_bytes(self, data: bytes) -> bytes:
        """Redact a whole log (or any bytes); everything outside the secrets is kept byte for byte."""
        return self._redact(bytes(data), _State())

    def redact_text(self, text: str) -> str:
        # surrogatepass round-trips any str, including lone surrogates from surrogateescape.
        data = text.encode("utf-8", "surrogatepass")
        out = self._redact(data, _State())
        return text if out is data else out.decode("utf-8", "surrogatepass")

    def redact_argv(self, argv: Iterable[str]) -> list[str]:
        """Redact a command line item by item, including the two-item form ``--password hunter2``
        and, after a mysql-family program, ``-pSECRET`` / ``-p SECRET`` (``[argv] program``)."""
        out: list[str] = []
        value_next: str | None = None  # the rule whose value the next item is
        in_program = False
        flag = self._program_flag
        for item in argv:
            # A secret-flag's value may start with one "-"; a -p value may not (mysql -p -h host).
            not_a_value = "-" if value_next == self._program_rule else "--"
            if value_next is not None and item and not item.startswith(not_a_value):
                out.append(placeholder(value_next))
                value_next = None
                continue
            value_next = None
            if in_program and item.startswith(flag) and item != flag and not item.startswith(flag + "["):
                out.append(flag + placeholder(self._program_rule))
                continue
            out.append(self.redact_text(item))
            if self._argv_flag and self._argv_flag.fullmatch(item):
                value_next = self._argv_rule
            elif in_program and item == flag:
                value_next = self._program_rule
            if item in _COMMAND_ENDS or item.endswith(_COMMAND_END_CHARS):
                in_program = False
            elif self._program is not None and self._program.fullmatch(item.rsplit("/", 1)[-1]):
                in_program = True
        return out

    def redact_mapping(self, mapping: Mapping[str, Any]) -> dict[str, Any]:
        """Redact label / environment values: whole when the key looks secret (``*_TOKEN``),
        else by the text rules; keys by the text rules (a token pasted as a label name). Non-string
        values are returned unchanged."""
        out: dict[str, Any] = {}
        for key, value in mapping.items():
            name = self.redact_text(key) if isinstance(key, str) else key
            if not isinstance(value, str) or not value:
                out[name] = value
            elif self._mapping_key is not None and self._mapping_key.search(key):
                out[name] = placeholder(self._mapping_rule)
            else:
                out[name] = self.redact_text(value)
        return out

    def redact_tree(self, value: Any) -> Any:
        """Redact a JSON-like value (run metadata, git state, event payloads): strings by the text
        rules, string values under a secret-looking key whole (as ``redact_mapping``), keys by the
        text rules, lists and dicts recursively; numbers, booleans and None unchanged."""
        if isinstance(value, str):
            return self.redact_text(value)
        if isinstance(value, Mapping):
            out: dict[Any, Any] = {}
            for key, item in value.items():
                secret_key = isinstance(key, str) and self._mapping_key is not None and self._mapping_key.search(key)
                name = self.redact_text(key) if isinstance(key, str) else key
                if secret_key and isinstance(item, str) and item:
                    out[name] = placeholder(self._mapping_rule)
                else:
                    out[name] = self.redact_tree(item)
            return out
        if isinstance(value, (list, tuple)):
            return [self.redact_tree(item) for item in value]
        return value

    def stream(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> LineRedactor:
        return LineRedactor(self, max_line_bytes=max_line_bytes)

    # -- engine ---------------------------------------------------------------------------------

    def _redact(self, data: bytes, state: _State, *, prefilter: bool = True) -> bytes:
        """Redact ``data``, which starts at a line start; returns ``data`` itself when unchanged."""
        if not data:
            return data
        cuts = self._prefiltered_cuts(data, state) if prefilter else self._cuts(data, state, prefilter=False)
        return _splice(data, cuts) if cuts else data

    def _prefiltered_cuts(self, data: bytes, state: _State) -> list[_Cut]:
        """The redactions of ``data``, searched only in the lines holding some rule's keyword or an
        escape sequence (a colour code may split a keyword).

        Those lines are joined and searched as one text (a rule sees one line at a time, so joining
        changes nothing); their redactions are then moved back to where the lines are. A PEM block
        in progress, or one starting here, needs the lines around it: the whole text is searched
        then, as it is when such lines are most lines anyway.
        """
        fast = len(data) >= FAST_MIN_B  # a large text: Hyperscan's searches are worth building (search.py)
        if state.pem_lines_left:
            return self._cuts(data, state, fast=fast) or []
        # Lower-cased only where the filter cannot match caselessly: the usual 128 KiB batch of
        # the relay is scanned as it is (search.text_lines).
        ranges = text_lines(data, self._line_filter)
        if ranges is None or ranges == [(0, len(data))]:
            return self._cuts(data, state, fast=fast) or []
        if not ranges:
            return []
        picked = b"".join([data[a:b] for a, b in ranges])
        found = self._cuts(picked, state, whole_for_pem=True, fast=fast)
        if found is None:
            return self._cuts(data, state, fast=fast) or []
        if not found:
            return found
        # Each redaction lies inside one line, so inside one range: shift it by that range's offset.
        starts: list[int] = []
        at = 0
        for a, b in ranges:
            starts.append(at)
            at += b - a
        moved: list[_Cut] = []
        for start, end, repl in found:
            i = bisect.bisect_right(starts, start) - 1
            shift = ranges[i][0] - starts[i]
            moved.append((start + shift, end + shift, repl))
        return moved

    def _cuts(
        self,
        data: bytes,
        state: _State,
        *,
        prefilter: bool = True,
        low: bytes | None = None,
        whole_for_pem: bool = False,
        fast: bool = False,
    ) -> list[_Cut] | None:
        """The redactions of ``data`` in its own positions, sorted and disjoint. Rules search the
        text without escape sequences; ``low`` is ``data`` lower-cased, when the caller has it.
        With ``whole_for_pem``: None when a private key block may start here (see above)."""
        has_escapes = b"\x1b" in data
        clean = _ANSI.sub(b"", data) if has_escapes else data
        if has_escapes or low is None:
            low = clean.lower()
        if whole_for_pem and self._pem is not None and any(k in low for k in self._pem[1].keywords):
            return None
        spans = self._spans(clean, low, state, prefilter=prefilter, fast=fast)
        if not spans:
            return []
        merged = _merge(spans)
        return _around_escapes(data, merged) if has_escapes else merged

    def _spans(
        self, clean: bytes, low: bytes, state: _State, *, prefilter: bool = True, fast: bool = False
    ) -> list[_Span]:
        """Every rule's finds in ``clean`` (escape-free; ``low`` is it lower-cased), unmerged."""
        spans: list[_Span] = []  # (start, rule order, end, replacement)
        present = present_keywords(self._keywords, low, fast=fast) if prefilter else frozenset()
        for order, rule in self._regex_rules:
            if prefilter:
                found = [k for k in rule.keywords if k in present]
                if not found:
                    continue
                windows = search_windows(low, self._anchors.get(rule.name, ()), found)
            else:
                windows = [(0, len(clean))]
            assert rule.regex is not None
            for start, stop in windows:
                for m in rule.regex.finditer(clean, start, stop):
                    s, e = m.span(rule.group)
                    if s < e:
                        spans.append((s, order, e, rule.replacement))
        if self._pem is not None:
            order, rule = self._pem
            if state.pem_lines_left or not prefilter or any(k in present for k in rule.keywords):
                spans.extend((s, order, e, rule.replacement) for s, e in _pem_spans(rule, clean, state))
        return spans


def _merge(spans: list[_Span]) -> list[_Cut]:
    """Overlapping finds become one redaction named after the earliest (then highest-priority) rule,
    so no byte of any secret survives whatever the rules' overlaps."""
    spans.sort()
    out: list[_Cut] = []
    for start, _order, end, repl in spans:
        if out and start < out[-1][1]:
            prev = out[-1]
            out[-1] = (prev[0], max(prev[1], end), prev[2])
        else:
            out.append((start, end, repl))
    return out


def _splice(data: bytes, spans: list[_Cut]) -> bytes:
    parts: list[bytes] = []
    last = 0
    for start, end, repl in spans:
        parts += (data[last:start], repl)
        last = end
    parts.append(data[last:])
    return b"".join(parts)


def _around_escapes(data: bytes, spans: list[_Cut]) -> list[_Cut]:
    """Spans are positions in the escape-free text; map them back to ``data`` and keep every
    escape: those just before or after a secret stay outside it, those inside follow the
    placeholder."""
    positions: list[int] = []  # where each escape sits in the escape-free text
    removed = [0]  # removed[k]: total length of the first k escapes
    escapes: list[bytes] = []
    for m in _ANSI.finditer(data):
        positions.append(m.start() - removed[-1])
        removed.append(removed[-1] + len(m.group()))
        escapes.append(m.group())
    mapped: list[_Cut] = []
    for start, end, repl in spans:
        first = bisect.bisect_right(positions, start)  # escapes at or before the secret's start
        inside_end = bisect.bisect_left(positions, end)  # escapes before its end
        kept = b"".join(escapes[first:inside_end])
        mapped.append((start + removed[first], end + removed[inside_end], repl + kept))
    return mapped


# -- PEM private key blocks ---------------------------------------------------------------------


def _pem_spans(rule: Rule, text: bytes, state: _State) -> list[tuple[int, int]]:
    """Key material of private key blocks: between BEGIN and END on one line, or the lines after
    a BEGIN line until END, a line that is not key material, or ``max_lines`` lines."""
    assert rule.begin is not None and rule.end is not None
    spans: list[tuple[int, int]] = []
    pos = _pem_body(rule, text, 0, state, spans) if state.pem_lines_left else 0
    eol: re.Match[bytes] | None = None
    line_end = -1
    while (begin := rule.begin.search(text, pos)) is not None:
        if begin.start() > line_end:  # a new line: find its end once, however many BEGINs it holds
            eol = _EOL.search(text, begin.end())
            line_end = eol.start() if eol else len(text)
        end = rule.end.search(text, begin.end(), line_end)
        if end is not None:
            if text[begin.end() : end.start()].strip():
                spans.append((begin.end(), end.start()))
            pos = end.end()
            continue
        if text[begin.end() : line_end].strip():
            spans.append((begin.end(), line_end))
        state.pem_lines_left = rule.max_lines
        pos = _pem_body(rule, text, eol.end() if eol else len(text), state, spans)
    return spans


def _pem_body(rule: Rule, text: bytes, pos: int, state: _State, spans: list[tuple[int, int]]) -> int:
    """Redact key lines from ``pos`` on; returns where the search for the next BEGIN resumes."""
    assert rule.end is not None
    size = len(text)
    while state.pem_lines_left and pos < size:
        eol = _EOL.search(text, pos)
        line_end = eol.start() if eol else size
        end = rule.end.search(text, pos, line_end)
        if end is not None:
            span = _key_material(text, pos, end.start())
            if span:
                spans.append(span)
            state.pem_lines_left = 0
            return end.end()
        line = text[pos:line_end]
        if line.strip():
            span = (pos, line_end) if _PEM_HEADER.match(line) else _key_material(text, pos, line_end)
            if span is None:  # not key material: the block ended without END
                state.pem_lines_left = 0
                return pos
            spans.append(span)
            state.pem_lines_left -= 1
        pos = eol.end() if eol else size
    return pos


def _key_material(text: bytes, start: int, stop: int) -> tuple[int, int] | None:
    """The base64 in text[start:stop]: the whole part when it is all base64, else a long enough
    base64 run at its end (a log prefix before it is kept)."""
    part = text[start:stop].rstrip(b" \t")
    body = part.lstrip(b" \t")
    if not body:
        return None
    run = len(part) - len(part.rstrip(_BASE64))
    if run == len(body):
        return (start + len(part) - run, start + len(part))
    if run >= _PEM_MIN_TRAILING_RUN:
        return (start + len(part) - run, start + len(part))
    return None


# -- loading ------------------------------------------------------------------------------------


def _joined(value: Any, what: str) -> str:
    # Token-like examples are written as lists of parts so secret scanners skip the repository.
    if isinstance(value, list):
        return "".join(str(v) for v in value)
    if isinstance(value, str):
        return value
    raise RedactionRuleError(f"{what}: expected a string or a list of strings")


def _compile(pattern: str, fragments: Mapping[str, str], what: str) -> re.Pattern[bytes]:
    for name, fragment in fragments.items():
        pattern = pattern.replace("{{" + name + "}}", fragment)
    if "{{" in pattern:
        raise RedactionRuleError(f"{what}: unknown fragment in {pattern!r}")
    try:
        return re.compile(pattern.encode("ascii"))
    except (re.error, UnicodeEncodeError) as exc:
        raise RedactionRuleError(f"{what}: bad pattern: {exc}") from exc


def _compile_rule(raw: Mapping[str, Any], fragments: Mapping[str, str]) -> Rule:
    name = str(raw.get("name", ""))
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
        raise RedactionRuleError(f"rule name {name!r}: use lower-case letters, digits and '-'")
    keywords = tuple(str(k) for k in raw.get("keywords", []))
    if not keywords or any(not k or k != k.lower() for k in keywords):
        raise RedactionRuleError(f"rule {name}: needs non-empty lower-case keywords")
    common = {
        "name": name,
        "description": str(raw.get("description", "")),
        "keywords": tuple(k.encode() for k in keywords),
        "example": _joined(raw.get("example", ""), f"rule {name} example"),
        "expected": _joined(raw.get("expected", ""), f"rule {name} expected"),
    }
    kind = raw.get("kind", "regex")
    if kind == "pem":
        return Rule(
            kind="pem",
            begin=_compile(str(raw["begin"]), fragments, f"rule {name} begin"),
            end=_compile(str(raw["end"]), fragments, f"rule {name} end"),
            max_lines=int(raw.get("max_lines", 400)),
            **common,
        )
    if kind != "regex":
        raise RedactionRuleError(f"rule {name}: unknown kind {kind!r}")
    regex = _compile(str(raw.get("regex", "")), fragments, f"rule {name}")
    anchor = _compile(str(raw["anchor"]), fragments, f"rule {name} anchor") if "anchor" in raw else None
    group = raw.get("group", 1)
    valid = group in regex.groupindex if isinstance(group, str) else 0 <= int(group) <= regex.groups
    if not valid:
        raise RedactionRuleError(f"rule {name}: no group {group!r} in its regex")
    return Rule(regex=regex, group=group, anchor=anchor, **common)


@functools.lru_cache(maxsize=1)
def _default_redactor() -> Redactor:
    # Beside this file, as autoload's sitedir is: importlib.resources would cost every gpuledger run
    # the import of its zip and URL machinery, half as long as building the rules.
    text = Path(__file__).with_name("redact_rules.toml").read_text("utf-8")
    return Redactor.from_toml(text)


# -- streaming ----------------------------------------------------------------------------------


class LineRedactor:
    """Redacts a byte stream (a run's output) line by line for the output relay.

    ``feed`` returns the redacted complete lines (ended by ``\\n`` or ``\\r``: progress bars
    redraw with ``\\r``) and holds back the incomplete tail; ``flush`` returns the tail at the end.
    For lines up to ``max_line_bytes`` the concatenated output equals ``redact_bytes`` of the whole
    input, however the stream was chunked.

    A tail longer than that is emitted early, to keep memory bounded, and the cut never lets a
    secret out: the whole tail is searched, the cut goes after its last blank (or ``CUT_LOOKAHEAD_B``
    before its end, so a token is seen with what follows it) and moves back to the start of any
    secret it would split; the last ``CUT_CONTEXT_B`` bytes emitted are kept and searched again
    with what comes next (never emitted twice), so a key name just before the cut still marks the
    value after it. Only a single secret longer than about ``max_line_bytes`` can still be cut.
    """

    def __init__(self, redactor: Redactor | None = None, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES):
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be positive")
        self._redactor = redactor or Redactor.default()
        self._max = max_line_bytes
        self._context = min(CUT_CONTEXT_B, max_line_bytes // 4)
        self._lookahead = min(CUT_LOOKAHEAD_B, max_line_bytes // 4)
        self._tail = bytearray()
        self._done = 0  # bytes at the start of the tail already emitted: context for the rules only
        self._state = _State()

    @property
    def pending(self) -> int:
        """Bytes held back (always at most ``max_line_bytes`` after a ``feed``)."""
        return len(self._tail)

    def feed(self, data: bytes) -> bytes:
        if not data:
            return b""
        # Search only the new data for line ends: the held tail has none.
        cut = max(data.rfind(b"\n"), data.rfind(b"\r"))
        out = b""
        if cut >= 0:
            view = memoryview(data)
            if self._tail:
                self._tail += view[: cut + 1]
                lines = bytes(self._tail)
            else:  # the usual case: no copy of a large chunk ending in a line end
                lines = bytes(data) if cut + 1 == len(data) else bytes(view[: cut + 1])
            out = self._emit(lines)
            self._tail = bytearray(view[cut + 1 :])
        else:
            self._tail += data
        if len(self._tail) > self._max:
            out += self._force()
        return out

    def flush(self) -> bytes:
        """The redacted tail; the stream may then be reused from a fresh start."""
        out = self._emit(bytes(self._tail)) if len(self._tail) > self._done else b""
        self._tail = bytearray()
        self._done = 0
        self._state = _State()
        return out

    def _emit(self, data: bytes) -> bytes:
        """``data`` (the tail and what completes it) redacted, less the context already emitted."""
        skip, self._done = self._done, 0
        if not skip:
            return self._redactor._redact(data, self._state)
        cuts = self._redactor._prefiltered_cuts(data, self._state)
        return _splice_from(data, skip, len(data), cuts)

    def _force(self) -> bytes:
        tail = bytes(self._tail)
        size, done = len(tail), self._done
        cuts = self._redactor._prefiltered_cuts(tail, self._state)
        stop = size - self._lookahead
        blank = max(tail.rfind(b" ", done, stop), tail.rfind(b"\t", done, stop))
        if blank >= 0 and size - (blank + 1) <= self._max // 2:
            stop = blank + 1
        for start, end, _ in cuts:  # sorted and disjoint: at most one holds the cut
            if start < stop < end:
                # Held back whole, to be redacted with its rest; one that fills the tail is cut
                # at its end instead (memory stays bounded).
                stop = start if start > done else min(end, size)
                break
        stop = max(stop, done + 1)
        out = _splice_from(tail, done, stop, cuts)
        keep_from = max(stop - self._context, 0)
        del self._tail[:keep_from]
        self._done = stop - keep_from
        return out


def _splice_from(data: bytes, begin: int, stop: int, cuts: list[_Cut]) -> bytes:
    """``data[begin:stop]`` with the redactions in it (one that starts before ``begin`` counts
    from there: its start was emitted already)."""
    inside = [(max(s, begin) - begin, min(e, stop) - begin, r) for s, e, r in cuts if e > begin and s < stop]
    return _splice(data[begin:stop], inside) if inside else data[begin:stop]
