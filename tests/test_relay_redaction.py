"""The fast redaction the output relay uses gives exactly what searching every line gives.

The engine hands the rules only the lines holding a keyword or an escape sequence (one search
built from the rules), finds which keywords occur in about one pass, and splits anchors that start
with a choice of words into one search per word. Each shortcut is checked against the plain
meaning on generated output long enough to go through every path (few keyword lines, most lines,
private key blocks, colour codes inside secrets), and in whatever pieces the stream arrives.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import tomllib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuledger.core.redaction import search as redact_search
from gpuledger.core.redaction.redact import LineRedactor, Redactor, _State

R = Redactor.default()
CORPUS = tomllib.loads((Path(__file__).parent / "data" / "redaction_corpus.toml").read_text(encoding="utf-8"))


def _joined(value: str | list[str]) -> str:
    return "".join(value) if isinstance(value, list) else value


SECRETS = [_joined(p["input"]).encode() for p in CORPUS["positive"]]
LOOKALIKES = [_joined(n["input"]).encode() for n in CORPUS["negative"]]
PEM = [
    b"-----BEGIN OPENSSH PRIVATE " + b"KEY-----\n",
    b"b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n",
    b"QyNTUxOQAAACBh0D8UBRh6ypbGULbB9rc4ywX1tvCANLNutJ0Wl1gSOwAAAJjBrpEGwa6R\n",
    b"-----END OPENSSH PRIVATE " + b"KEY-----\n",
]
QUIET = [
    b"      1/100      3.21G      1.234      2.345      1.111        123        640:  "
    b"45%|\xe2\x96\x88\xe2\x96\x8c   | 123/272\r",
    b"step 120 | loss 2.3412 | lr 3.00e-04 | tokens/s 45123 | mfu 41.2%\n",
    b"-" * 60 + b"\n",
    b"Downloading https://github.com/ultralytics/assets/releases/download/v8.2.0/yolov8n.pt\n",
    b"\x1b[34m\x1b[1mtrain: \x1b[0mScanning /data/labels... 128 images, 0 corrupt\n",
    b'config: {"layer_1_key_dim": 64, "token_mix": 0.5, "pad_token_id": 0}\n',
    b"\n",
    b"\r",
    b"\r\n",
]
PIECES = [*SECRETS, *LOOKALIKES, *PEM, *QUIET, b"\x1b[31m", b"\x1b[0m", b"TOKEN=", b"key: ", b" ", b"\xff\xfe"]


def _line(items: list[bytes]) -> bytes:
    return b"".join(items)


# Outputs of many lines, some lines quiet and some holding secrets, so that both the picked-lines
# path and the "keywords on most lines" path are taken.
_outputs = st.lists(
    st.one_of(
        st.sampled_from(QUIET),
        st.lists(st.sampled_from(PIECES), min_size=1, max_size=4).map(_line),
        st.binary(max_size=8),
    ),
    max_size=400,
).map(b"".join)


def _stream(chunks: list[bytes]) -> bytes:
    lr = LineRedactor(R)
    return b"".join(lr.feed(c) for c in chunks) + lr.flush()


def _chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=_outputs)
def test_picking_lines_changes_nothing(data: bytes) -> None:
    assert R._redact(data, _State()) == R._redact(data, _State(), prefilter=False)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=_outputs, cuts=st.lists(st.integers(min_value=0, max_value=1 << 20), max_size=20))
def test_stream_in_any_pieces_equals_the_whole(data: bytes, cuts: list[int]) -> None:
    assert _stream(_chunked(data, cuts)) == R._redact(data, _State(), prefilter=False)


def test_keywords_on_most_lines_take_the_whole_text_path_and_agree() -> None:
    lines = [b"tokens/s %d batch_key=%d\n" % (i, i) for i in range(2000)]  # key= matches an anchor
    lines[777] = b"export HF_TOKEN=abc123secret\n"
    data = b"".join(lines)
    assert redact_search.keyword_lines(data.lower(), R._line_filter) is None  # most lines: whole text
    out = _stream([data[i : i + 4096] for i in range(0, len(data), 4096)])
    assert out == R._redact(data, _State(), prefilter=False)
    assert b"abc123secret" not in out and out.count(b"[REDACTED:") == 1


def test_a_keyword_split_by_a_colour_code_on_a_quiet_line_is_found() -> None:
    quiet = b"".join(QUIET[:2]) * 50
    data = quiet + b"\x1b[31mMY_TO\x1b[1mKEN=abc123xyz\x1b[0m\n" + quiet  # "token" is only there without escapes
    out = R.redact_bytes(data)
    assert out == quiet + b"\x1b[31mMY_TO\x1b[1mKEN=[REDACTED:env-secret]\x1b[0m\n" + quiet


def test_a_private_key_after_quiet_lines_is_redacted_line_by_line() -> None:
    quiet = QUIET[1] * 20
    data = quiet + b"".join(PEM) + quiet
    out = _stream([data[i : i + 7] for i in range(0, len(data), 7)])
    assert out == R._redact(data, _State(), prefilter=False)
    assert b"b3BlbnNzaC1rZXkt" not in out and out.count(b"[REDACTED:private-key]") == 2


_low_text = st.lists(
    st.sampled_from(
        [b"token", b"secret", b"key", b"_pass", b"pass", b"=", b":", b'"', b"'", b" ", b"\t", b"\n", b"x", b"-", b"_"]
    ),
    max_size=40,
).map(b"".join)


def _lines_matching(low: bytes, patterns: list[re.Pattern[bytes]]) -> set[int]:
    lines = re.split(rb"[\r\n]", low)
    return {i for i, line in enumerate(lines) if any(p.search(line) for p in patterns)}


@settings(max_examples=300, deadline=None)
@given(low=_low_text)
def test_anchor_parts_find_the_lines_the_anchor_finds(low: bytes) -> None:
    for rule in R.rules:
        if rule.anchor is None:
            continue
        parts = list(redact_search.anchor_parts(rule.anchor))
        assert _lines_matching(low, parts) == _lines_matching(low, [rule.anchor]), rule.name


def test_anchors_that_start_with_a_choice_of_words_are_split() -> None:
    anchor = re.compile(rb"(?:token|secret|key)[=:]")
    assert [p.pattern for p in redact_search.anchor_parts(anchor)] == [b"token[=:]", b"secret[=:]", b"key[=:]"]
    kept = re.compile(rb"(?:password|passwd)[=:]")  # one first letter: the engine skips to it already
    assert redact_search.anchor_parts(kept) == (kept,)
    odd = re.compile(rb"(?:a[b]|c)d")  # not plain words
    assert redact_search.anchor_parts(odd) == (odd,)


_keyword_text = st.lists(
    st.sampled_from([k for r in R.rules for k in r.keywords] + [b"x", b" ", b"\n", b"\r", b"\x1b", b"-", b"s", b"k"]),
    max_size=30,
).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(low=_keyword_text)
def test_present_keywords_are_exactly_the_keywords_present(low: bytes) -> None:
    assert redact_search.present_keywords(R._keywords, low) == {k for k in R._keywords if k in low}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=_outputs)
def test_the_line_filter_picks_every_line_a_rule_can_match_in(data: bytes) -> None:
    ranges = redact_search.keyword_lines(data.lower(), R._line_filter)
    if ranges is None:
        return  # most lines: the whole text is searched
    picked = set()
    for a, b in ranges:
        picked.update(range(a, b))
    pem = [k for r in R.rules if r.kind == "pem" for k in r.keywords]
    pos = 0
    for line in re.findall(rb"[^\r\n]*[\r\n]|[^\r\n]+\Z", data):
        matched = any(r.regex is not None and r.regex.search(line) for r in R.rules)
        if matched or b"\x1b" in line or any(k in line.lower() for k in pem):
            assert set(range(pos, pos + len(line))) <= picked, line
        pos += len(line)
    assert pos == len(data)


def test_a_metrics_row_with_tokens_is_not_a_candidate_but_an_assignment_is() -> None:
    rows = b"step 1 | tokens/s 4512 | key_dim 64 | passed\n" * 3
    assert redact_search.keyword_lines(rows.lower(), R._line_filter) == []
    found = redact_search.keyword_lines((rows + b"hub_token: abc\n" + rows).lower(), R._line_filter)
    assert found == [(len(rows), len(rows) + len(b"hub_token: abc\n"))]


def test_an_anchor_splits_into_its_fixed_start_and_the_rest_only_when_that_keeps_its_meaning() -> None:
    split = redact_search._literal_and_rest
    assert split(rb"token[=:]") == (b"token", rb"[=:]")
    assert split(rb"keys?=") == (b"key", rb"s?=")  # the quantified byte is not fixed
    assert split(rb"a\.b\-c=") == (b"a.b-c=", b"")
    assert split(rb"tok(?:en)*=") == (b"tok", rb"(?:en)*=")
    assert split(rb"ab|cd") is None  # an alternative without the fixed start
    assert split(rb"a[|]b") == (b"a", rb"[|]b")  # a | inside a class is a byte
    assert split(rb"a(x|y)b") == (b"a", rb"(x|y)b")
    assert split(rb"(a)b\1") is None  # a back reference would point elsewhere once embedded
    assert split(rb"\d+x") is None and split(rb"[ab]c") is None and split(rb"(?i)key") is None
    entries = redact_search._anchor_entries(re.compile(rb"(?:password|passwd)[=:]"))
    assert entries == [(b"password", rb"[=:]"), (b"passwd", rb"[=:]")]


def test_a_rule_whose_anchor_has_no_fixed_start_is_found_by_its_keywords() -> None:
    rules = [((b"token",), re.compile(rb"[a-z]+token=")), ((b"xox",), None)]
    search = redact_search.line_filter(rules, extra=())
    assert redact_search.keyword_lines(b"tokens/s 5\nnothing\nxox\n", search) == [(0, 11), (19, 23)]
