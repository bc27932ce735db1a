"""The end-of-run readers of a chatty output are fast and give what the plain versions gave.

``screen_lines`` decodes only each line's last ``\\r`` draw, the YOLO parser splits only the lines
that are table rows, and the failure patterns only search lines holding their words. Each is
checked here against the straightforward version (written out below) on generated output made
of the pieces that matter: redraws, escapes, broken UTF-8, Unicode blanks and case look-alikes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ci_support
from gpuledger.core.training import failures, logparse
from gpuledger.core.training.candidates import candidate_lines

DATA = Path(__file__).parent / "data" / "yolo"
_ANSI_STR = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def plain_screen_lines(data: bytes) -> list[str]:
    """The whole output decoded, escapes removed, then each line's last non-blank draw."""
    text = _ANSI_STR.sub("", data.decode("utf-8", "replace"))
    lines = []
    for raw in text.split("\n"):
        draws = [part for part in raw.split("\r") if part.strip()]
        lines.append(draws[-1] if draws else "")
    return lines


_BYTES = [
    b"\r",
    b"\n",
    b"\r\n",
    b" ",
    b"\t",
    b"\x0b",
    b"\x0c",
    b"\x1c",
    b"\xc2\x85",  # NEL: blank for str.strip, not for bytes.strip
    b"\xc2\xa0",
    b"\xe2\x96\x88",  # a progress bar block
    b"\xe2\x96",  # a cut UTF-8 character
    b"\xff",
    b"\xc3",
    b"\x1b[32m",
    b"\x1b[0m",
    b"\x1b[K",
    b"\x1b]0;title\x07",
    b"\x1b]8;;http://x\x1b\\",
    b"\x1b]0;runs\nacross\x07",  # an OSC across a line end
    b"\x1b",
    b"\x1bM",
    b"  1/10  0.5G  1.234  45%|",
    b"Epoch",
    b"word",
]
_outputs = st.lists(st.one_of(st.sampled_from(_BYTES), st.binary(max_size=6)), max_size=40).map(b"".join)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_outputs)
def test_screen_lines_equal_decoding_everything_first(data: bytes) -> None:
    assert logparse.screen_lines(data) == plain_screen_lines(data)


def test_screen_lines_of_the_captured_trainings_are_unchanged() -> None:
    for path in sorted(DATA.glob("*.log")):
        data = path.read_bytes()
        assert logparse.screen_lines(data) == plain_screen_lines(data), path.name


class _PlainParser(logparse._Parser):
    """The parser as it was: every line split whole, every pattern tried on every line."""

    def line(self, line: str) -> None:
        tokens = line.split()
        if not tokens:
            return
        if tokens[0] == "Epoch" and len(tokens) > 2 and tokens[1].lower() == "gpu_mem":
            self.columns = tokens
            if self.out.format is None:
                v5 = tokens[1] == "gpu_mem" or any(t in ("obj_loss", "obj") for t in tokens)
                self.out.format = logparse.YOLOV5 if v5 else logparse.ULTRALYTICS
            return
        head = logparse._PERCENT.match(line)
        desc = head.group(1) if head else line
        if self.columns and logparse._PROGRESS.match(line):
            self._progress(desc.split())
            return
        keys = logparse._val_keys(desc.split(), self.out.format)
        if keys is not None:
            self.val_keys = keys
        elif tokens[0] == "all" and self.val_keys:
            self._val_result(tokens[1:])
        elif re.search(r"\d+ epochs? completed in", line):
            self._finish_training()
        elif "recovering from last.pt" in line and self.current is not None:
            self.rows.pop(self.current, None)


def _parse(parser: logparse._Parser, lines: list[str]) -> str:
    """The parse as text: a NaN loss is "nan" on both sides (NaN != NaN as a float)."""
    for line in lines:
        parser.line(line)
        parser.out.line_epochs.append(parser.current)
    return repr(parser.result())


_LINES = [
    "      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size",
    "Epoch gpu_mem box obj cls labels img_size",
    "        1/3      0.5G      1.234      2.345      1.111         12        640: 100%|██| 4/4 [00:01<00:00]",
    "        2/3      0.5G        nan      2.345      1.111         12        640:  50%|█ | 2/4",
    "       0/2     0G   0.1   0.2   0.3   5   64",
    "                 Class     Images  Instances      Box(P          R      mAP50  mAP50-95): 100%|██| 1/1",
    "               Class     Images     Labels          P          R     mAP@.5 mAP@.5:.95",
    "                   all        128        929      0.512      0.433      0.471      0.301",
    "   classes   top1_acc   top5_acc: 100%",
    "                   all      0.75       0.95",
    "3 epochs completed in 0.011 hours.",
    "1 epoch completed in 0.001 hours.",
    "WARNING ⚠️ NaN/Inf detected, recovering from last.pt",
    "config: {" + ", ".join(f'"layer_{i}": {i}' for i in range(300)) + "}",
    "train: 45% done: 12% left",
    "Class Images",
    "classes",
    "Class Images Instances: 40%",  # the header's words before tqdm's ": NN%"
    "classes:  80%",
    "step      1 | loss 2.1 | mfu 41.2% | time 90ms",  # no first word the parser looks at
    "        \u00b2/3      0.5G      1.234      2.345      1.111         12        640",  # a digit to str.isdigit
    "all",
    "",
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(st.sampled_from(_LINES), max_size=30))
def test_parser_reads_what_the_plain_parser_reads(lines: list[str]) -> None:
    assert _parse(logparse._Parser(), lines) == _parse(_PlainParser(), lines)


def test_parser_on_the_captured_trainings_is_unchanged() -> None:
    for path in sorted(DATA.glob("*.log")):
        lines = logparse.screen_lines(path.read_bytes())
        assert _parse(logparse._Parser(), lines) == _parse(_PlainParser(), lines), path.name


_PATTERNS = (failures._OOM, failures._NAN, failures._DATASET, failures._WORKER_KILLED, failures._SHELL_KILLED)
_FAILURE_PIECES = [
    "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0",
    "CUDA error: out of memory",
    "torch.OutOfMemoryError",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "Loss NaN/Inf detected",
    "FITNESS nan/INF DETECTED",
    "NaN persisted",
    "Non-Finite LOSS",
    "loss is nan",
    "Dataset 'coco.yaml' images not found",
    "DATASET x error",
    "dataſet error",  # long s: IGNORECASE reads it as s
    "non-fİnite loss",  # dotted capital I: IGNORECASE reads it as i
    "nan persıSted",
    "ERROR: DataLoader worker (pid 123) is killed by signal: Killed.",
    "Killed",
    "./train.sh: line 3:  4242 Killed    python train.py",
    "Killed ",
    " Killed",
    "KILLED",
    "out of\nmemory",
    "Epoch 3/10",
    "ok",
    " ",
    "K",  # Kelvin sign
]
_logs_lines = st.lists(st.lists(st.sampled_from(_FAILURE_PIECES), max_size=4).map(" ".join), max_size=12).map(
    lambda lines: "\n".join(lines).split("\n")
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=_logs_lines)
def test_every_line_a_failure_pattern_matches_is_searched(lines: list[str]) -> None:
    searched = set(failures._lines_to_search(lines))
    for i, line in enumerate(lines):
        if any(p.search(line.strip()) for p in _PATTERNS):
            assert i in searched, line


_DETECTORS = [p for p in vars(failures).values() if isinstance(p, re.Pattern) and p not in failures.DETAIL_PATTERNS]
_ONE_LINE = st.characters(blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


@pytest.mark.parametrize("pattern", _DETECTORS, ids=lambda p: p.pattern[:24])
def test_the_words_find_every_line_a_failure_pattern_can_match(pattern: re.Pattern[str]) -> None:
    # Generated from each pattern itself (any case, any text around it), so a pattern added to
    # failures.py without its words in the prefilter fails here, not silently in production.
    assert len(_DETECTORS) >= 5

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(line=st.from_regex(pattern, alphabet=_ONE_LINE))
    def found(line: str) -> None:
        if pattern.search(line.strip()):
            assert 1 in failures._lines_to_search(["Epoch 1/3", line]), line

    found()


def test_a_log_without_the_words_has_no_line_searched() -> None:
    lines = logparse.screen_lines((DATA / "yolov8n_detect.log").read_bytes())
    assert failures._lines_to_search(lines) == []
    killed = logparse.screen_lines((DATA / "fail_shell_killed.log").read_bytes())
    assert [killed[i] for i in failures._lines_to_search(killed) if "Killed" in killed[i]]


# -- only the lines that may matter (core/training/candidates.py) ------------------------------

_HEADER = b"\n      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size\n"
_VAL_HEADER = b"\n                 Class     Images  Instances      Box(P          R      mAP50  mAP50-95)\n"
_TRICKY = [
    _HEADER,
    _VAL_HEADER,
    b"Ep\x1b[0moch gpu_mem box obj",  # a first word split by a colour code
    b"Kil\x1b[31mled",  # a failure word split by one
    b"\x1b[1m      Epoch    GPU_mem   box_loss",
    b"\n      \xd9\xa3/3      0.5G      1.234      2.345      1.111         12        640",  # an Arabic-Indic 3
    b"\n\xc2\xa0\xc2\xa02/3      0.5G      1.234      2.345      1.111         12        640",  # Unicode blanks
    b"\n\xc2\xa0all        128        929      0.512      0.433      0.471      0.301",
    b"\r \r",  # blank draws after the last one
    b"\r\xc2\xa0\r",
    b"\r\x1b[0m\r",
    b"dataset",
    b"NaN",
]
_mixed = st.lists(
    st.one_of(
        st.sampled_from(_BYTES),
        st.sampled_from(_TRICKY),
        st.sampled_from([line.encode() for line in _LINES]),
        st.sampled_from([piece.encode() for piece in _FAILURE_PIECES]),
        st.binary(max_size=4),
    ),
    max_size=40,
).map(b"".join)


def _every_line(data: bytes) -> str:
    """What the end-of-run reader gives when it decodes every line: parsed output and searched lines."""
    lines = logparse.screen_lines(data)
    return repr((logparse.parse_lines(lines), [(i, lines[i]) for i in failures._lines_to_search(lines)]))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_mixed)
def test_reading_only_the_candidate_lines_gives_what_reading_every_line_gives(data: bytes) -> None:
    assert repr(failures._read(data, 0)) == _every_line(data)


def test_the_captured_trainings_take_the_fast_reader_and_read_the_same() -> None:
    ci_support.need_module("hyperscan", "pip install hyperscan (a dependency of gpuledger on x86-64 Linux)")
    taken = 0
    for path in sorted(DATA.glob("*.log")):
        data = path.read_bytes()
        found = candidate_lines(data, 0)
        taken += found is not None
        if found is not None:
            assert found[1] == len(logparse.screen_lines(data)), path.name
        assert repr(failures._read(data, 0)) == _every_line(data), path.name
    assert taken >= 3


def test_the_fast_reader_leaves_lines_that_cannot_matter_and_gives_way_where_it_must() -> None:
    ci_support.need_module("hyperscan", "pip install hyperscan (a dependency of gpuledger on x86-64 Linux)")
    data = b"step 1 | loss 2.0\n  1/3 0.5G\r  2/3 0.5G\r  \nconfig: x\n\x1b[1mEpoch\nall done\n"
    assert candidate_lines(data, 0) == ([(1, b"  1/3 0.5G\r  2/3 0.5G\r  "), (3, b"\x1b[1mEpoch"), (4, b"all done")], 6)
    assert candidate_lines(b"a\n  1/3 x\rstep 2\n", 0) == ([], 3)  # the last draw is what the screen shows
    assert candidate_lines(b"title \x1b]0;a\nb\x07\n", 0) is None  # an OSC may run across a line end
    assert candidate_lines("data\u017fet error\n".encode(), 0) is None  # IGNORECASE's long s
    assert candidate_lines(b"  1/3 0.5G\n") is None  # short: read line by line at once


def test_rows_whose_first_word_starts_after_unicode_blanks_or_with_a_unicode_digit_are_read() -> None:
    rows = [
        b"      \xd9\xa3/3      0.5G      1.234      2.345      1.111         12        640",  # an Arabic-Indic 3
        b"\xc2\xa0\xc2\xa02/3      0.5G      1.234      2.345      1.111         12        640",  # no-break spaces
    ]
    for row in rows:
        data = _HEADER + b"  1/3      0.5G      1.0      2.0      1.0         12        640\n" + row + b"\n"
        assert repr(failures._read(data, 0)) == _every_line(data)
        assert [e.epoch for e in failures._read(data, 0)[0].epochs] == [1], row
