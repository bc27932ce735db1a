"""The relay's line filter scans a batch as it is, not lower-cased, where Hyperscan can match its
entries caselessly (core/redaction/fastfilter.case_blind, search.text_lines): the lines found
must be those the reference regex finds in the lower-cased text, whatever the case of the text."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ci_support import need_module
from gpuledger.core.redaction import fastfilter
from gpuledger.core.redaction import search as redact_search
from gpuledger.core.redaction.redact import Redactor

need_module("hyperscan", "pip install hyperscan (a dependency of gpuledger on x86-64 Linux)")

R = Redactor.default()
FILTER = R._line_filter
EXAMPLES = sorted({r.example.encode() for r in R.rules if r.example})
KEYWORDS = sorted({k for r in R.rules for k in r.keywords})
FILLER = [b"tokens/s 45 ", b"key_dim", b"--", b"-" * 40, b"\x1b[31m", b"=", b":", b"'", b'"', b" ", b"\t"]
FILLER += [b"\n", b"\r", b"x", b"\xc4\xb0", b"step 1 | loss 2.0", b"Password", b"SECRET_ACCESS_KEY "]


def _case(data: bytes, pattern: list[bool]) -> bytes:
    """``data`` with each ASCII letter upper-cased where ``pattern`` (cycled) says so."""
    if not pattern:
        return data
    return bytes(b - 32 if 0x61 <= b <= 0x7A and pattern[i % len(pattern)] else b for i, b in enumerate(data))


@st.composite
def _text(draw: st.DrawFn) -> bytes:
    pieces = draw(st.lists(st.sampled_from(FILLER + KEYWORDS + EXAMPLES), max_size=50))
    return _case(b"".join(pieces), draw(st.lists(st.booleans(), max_size=7)))


def _reference(data: bytes) -> list[tuple[int, int]] | None:
    return redact_search.keyword_lines(data.lower(), FILTER.search)  # the bare regex on lower-cased text


def test_the_default_rules_are_scanned_caselessly() -> None:
    ends = FILTER.match_ends()
    assert ends is not None and getattr(ends, "caseless", False)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_text())
def test_the_caseless_scan_finds_the_lines_the_reference_finds_in_the_lower_cased_text(data: bytes) -> None:
    ends = FILTER.match_ends()
    assert ends is not None
    assert redact_search.lines_from_match_ends(data, ends(data)) == _reference(data)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=_text(), times=st.integers(1, 300))
def test_text_lines_of_a_large_text_equal_the_reference(data: bytes, times: int) -> None:
    quiet = b"      1/100      3.21G      1.234   45%|   | 123/272\n" * 400  # over FAST_MIN_B
    text = quiet + (data + b"\n") * times
    assert len(text) >= redact_search.FAST_MIN_B
    assert redact_search.text_lines(text, FILTER) == _reference(text)


def test_an_upper_case_secret_in_a_large_batch_is_redacted() -> None:
    quiet = b"step 1 | tokens/s 45123 | loss 2.0\n" * 1000
    data = quiet + b"EXPORT HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567\n" + quiet
    out = R.redact_bytes(data)
    assert b"AbCdEfGhIjKlMnOpQrStUvWxYz01234567" not in out and b"[REDACTED:" in out


def test_what_can_match_an_upper_case_letter_is_not_case_blind() -> None:
    for source in (rb"A", rb"\x41", rb"[A-Z]", rb"[@-\[]", rb"[^A]", rb"x[^B]", rb"(?i)a", rb"(?-i:a)", rb"a(?=b)"):
        assert not fastfilter.case_blind(source), source
    for source in (rb"", rb"a", rb"[^a]", rb'["\']?[ \t]*[=:]', rb"\w+\d\s.\b", rb"[_-]?(?:access[_-]?)?key", rb"a|b"):
        assert fastfilter.case_blind(source), source


def test_a_filter_that_matches_upper_case_keeps_lower_casing_the_text() -> None:
    # On the lower-cased text "[A-Z]" never matches: a caseless scan would find "xA" below.
    flt = redact_search.LineFilter([(b"x", rb"[A-Z]")])
    ends = flt.match_ends()
    assert ends is not None and not getattr(ends, "caseless", True)
    text = b"step 1\n" * 4000 + b"xA\n"
    assert redact_search.text_lines(text, flt) == redact_search.keyword_lines(text.lower(), flt.search) == []
