"""The line filter's fast path (Hyperscan, core/redaction/fastfilter.py) finds exactly the lines
its reference regex finds (core/redaction/search.py), on generated output holding every rule's
example secret whole, cut anywhere and mixed with look-alikes, colour codes and line ends."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ci_support import need_module
from gpuledger.core.redaction import fastfilter
from gpuledger.core.redaction import search as redact_search
from gpuledger.core.redaction.redact import Redactor, _State

need_module("hyperscan", "pip install hyperscan (a dependency of gpuledger on x86-64 Linux)")

R = Redactor.default()
FILTER = R._line_filter
EXAMPLES = sorted({r.example.encode() for r in R.rules if r.example})
KEYWORDS = sorted({k for r in R.rules for k in r.keywords})
FILLER = [
    b"tokens/s 45123 ",
    b"key_dim",
    b'"token_mix": 0.5, ',
    b"--",
    b"-" * 60,
    b"\x1b[31m",
    b"\x1b[0m",
    b"password",
    b"passwd =",
    b"_pass",
    b"secret_access_key ",
    b'"token": ',
    b"TOKEN=",
    b"key :",
    b"\t",
    b" ",
    b"=",
    b":",
    b"'",
    b"\n",
    b"\r",
    b"\r\n",
    b"x",
    b"\xff\xfe",
    b"      1/100      3.21G      1.234   45%|\xe2\x96\x88   | 123/272",
    b"step 120 | loss 2.3412 | lr 3.00e-04 | mfu 41.2%",
]


@st.composite
def _piece(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.sampled_from(FILLER))
    if kind == 1:
        return draw(st.sampled_from(KEYWORDS))
    example = draw(st.sampled_from(EXAMPLES))
    if kind == 2:  # a piece of it, cut at any two bytes
        a = draw(st.integers(0, len(example)))
        example = example[a : draw(st.integers(a, len(example)))]
    return example.upper() if draw(st.integers(0, 4)) == 0 else example


_text = st.lists(_piece(), max_size=60).map(b"".join)


def _fast(flt: redact_search.LineFilter, low: bytes) -> list[tuple[int, int]] | None:
    ends = flt.match_ends()
    assert ends is not None
    return redact_search.lines_from_match_ends(low, ends(low))


def _both(data: bytes) -> tuple[list[tuple[int, int]] | None, list[tuple[int, int]] | None]:
    low = data.lower()
    reference = redact_search.keyword_lines(low, FILTER.search)  # the bare regex: the reference path
    return _fast(FILTER, low), reference


def test_the_default_rules_take_the_fast_path_on_large_texts() -> None:
    assert FILTER.match_ends() is not None
    data = b"step 1 | tokens/s 45\n" * 2000 + b"export HF_TOKEN=hf_x\n"
    assert len(data) >= redact_search.FAST_MIN_B
    assert redact_search.keyword_lines(data.lower(), FILTER) == [(len(data) - 21, len(data))]


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_text)
def test_the_fast_filter_finds_the_lines_the_reference_regex_finds(data: bytes) -> None:
    fast, reference = _both(data)
    assert fast == reference


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(line=_text, quiet=st.sampled_from([b"step 1 | loss 2.0\n", b"x\r", b""]), times=st.integers(200, 400))
def test_the_same_most_lines_judgement(line: bytes, quiet: bytes, times: int) -> None:
    # Hundreds of lines: the "keywords on most lines" judgement (None) is made on the same lines.
    fast, reference = _both((line + b"\n" + quiet) * times)
    assert fast == reference


def test_found_lines_are_whole_lines_with_their_terminators() -> None:
    data = b"step 1 | tokens/s 45\nexport HF_TOKEN=hf_x\r\nplain\rkey: v"
    assert _both(data) == ([(21, 42), (49, 55)], [(21, 42), (49, 55)])


def test_an_entry_that_could_reach_the_next_line_keeps_the_reference() -> None:
    assert fastfilter.stays_on_its_line(rb"""["']?[ \t]*[=:]""")
    assert fastfilter.stays_on_its_line(rb"[_-]?(?:access[_-]?)?key\w\d{2}")
    for source in (rb"\s*=", rb"[^a]", rb".", rb"(?:a|\n)", rb"[\x00-\x7f]", rb"\W", rb"(?=x)", rb"("):
        assert not fastfilter.stays_on_its_line(source), source
    crossing = redact_search.LineFilter([(b"key", rb"\s*=")])
    assert crossing.match_ends() is None  # "key\n=" would be one match across two lines
    assert redact_search.keyword_lines(b"a key\n= b\nc\n", crossing) == [(0, 10)]


def test_an_entry_hyperscan_cannot_take_keeps_the_reference() -> None:
    behind = redact_search.LineFilter([(b"key", rb"(?<=y)=")])
    assert behind.match_ends() is None
    assert redact_search.keyword_lines(b"x\nkey=1\n", behind) == [(2, 8)]


def test_a_filter_on_other_rules_agrees_too() -> None:
    rules = [((b"token",), re.compile(rb"""(?:token|auth)["']?[ \t]*[=:]""")), ((b"xox",), None)]
    flt = redact_search.line_filter(rules, extra=(b"\x1b",))
    data = b"tokens/s 5\nauth = 1\nnothing\nxox\n\x1b[0m\ntoken:"
    assert _fast(flt, data) == redact_search.keyword_lines(data, flt.search) == [(11, 20), (28, len(data))]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_text)
def test_hyperscan_finds_which_keywords_occur_as_the_regex_does(data: bytes) -> None:
    low = data.lower()
    fast = redact_search.present_keywords(R._keywords, low, fast=True)
    assert fast == redact_search.reference_present_keywords(R._keywords, low) == {k for k in R._keywords if k in low}


def test_a_rule_of_dashes_is_one_match_and_dashes_at_the_very_end_are_found() -> None:
    ends = FILTER.match_ends()
    assert ends is not None
    rule = b"-" * 100 + b"\n"
    assert len(ends(rule * 3)) == 3  # once per rule, not at each of its 99 pairs of dashes
    assert _both(b"x\nend --") == ([(2, 8)], [(2, 8)])
    assert _both(b"--\r--\n") == ([(0, 6)], [(0, 6)])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=_text, filler=st.sampled_from(FILLER[-2:]))
def test_redacting_a_large_text_through_hyperscan_equals_the_plain_engine(data: bytes, filler: bytes) -> None:
    quiet = (filler + b"\n") * (redact_search.FAST_MIN_B // len(filler))
    text = quiet + data + b"\n" + quiet + data
    assert len(text) >= redact_search.FAST_MIN_B
    assert R._redact(text, _State()) == R._redact(text, _State(), prefilter=False)


def test_a_failing_hyperscan_scan_leaves_the_reference_to_answer() -> None:
    # A scratch space made for another database: Hyperscan itself refuses the scan (HS_INVALID).
    flt = redact_search.line_filter([(r.keywords, r.anchor) for r in R.rules], extra=(b"\x1b",))
    ends = flt.match_ends()
    assert ends is not None
    other = fastfilter.match_ends_finder([(b"x", None)])
    assert other is not None
    ends._local.scratch = fastfilter.database_scratch(other._database)  # type: ignore[attr-defined]
    data = (b"step 1 | tokens/s 45\n" * 1000 + b"export HF_TOKEN=hf_x\n").lower()
    assert redact_search.keyword_lines(data, flt) == redact_search.keyword_lines(data, flt.search)
    assert flt.match_ends() is None  # the reference from now on
