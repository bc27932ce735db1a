"""The relay's line index (core/training/lineindex.py) gives the end-of-run readers exactly what
scanning the log gives: the same candidate lines and count, the same failure explanation, epochs
and metrics, the same eval marker, whatever the places the log was cut into writes; and no index
where it cannot be exact (a capped log, an output candidates.py does not claim)."""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import subprocess
import sys
import threading
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ci_support
from gpuledger.core.redaction.redact import Redactor
from gpuledger.core.training import candidates, failures, lineindex
from gpuledger.integrations.ultralytics.eval_postrun import console_record
from gpuledger.recorder import relay, wrap

_PIECES = [
    b"\n",
    b"\r",
    b"\r\n",
    b" ",
    b"\xc2\xa0",
    b"\xff\xfe",  # binary garbage
    b"\xe2\x96",  # a cut UTF-8 character
    b"\x1b[32m",
    b"\x1b[K",
    b"\x1b]0;title\x07",  # an OSC: every line is read
    b"\n      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size\n",
    b"\n        1/3      0.5G      1.234      2.345      1.111         12        640: 100%|##| 4/4\n",
    b"\r        2/3      0.5G        nan      2.345      1.111         12        640:  50%|#",
    b"\n                 Class     Images  Instances      Box(P          R      mAP50  mAP50-95)\n",
    b"                   all        128        929      0.512      0.433      0.471      0.301\n",
    b"3 epochs completed in 0.011 hours.\n",
    b"CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0",
    b"Dataset 'coco.yaml' images not found\n",
    b"Killed\n",
    b"Loss NaN/Inf detected, recovering from last.pt\n",
    b"Benchmarks complete for yolov8n.pt on coco8.yaml at imgsz=640 (12.3s)\n",
    b"api_key=sk-abcdefghijklmnopqrstuvwxyz0123456789ABCD\n",  # a secret
    b"export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n",
    b"password: hunter2hunter2\n",
    b"Epoch",
    b"step 12 | loss 2.1 | tokens/s 4000\n",
]
_HUGE = [b"config: {" + b"x" * n + b"}" for n in (70_000, 200_000)]
_logs = st.lists(st.one_of(st.sampled_from(_PIECES), st.sampled_from(_HUGE), st.binary(max_size=8)), max_size=40).map(
    b"".join
)


def _cuts(data: bytes, points: list[int]) -> list[bytes]:
    cuts = sorted({p % (len(data) + 1) for p in points} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(cuts)]


def _index(pieces: list[bytes], hold_b: int = 0) -> lineindex.LineIndex | None:
    indexer = lineindex.LineIndexer(hold_b)
    for piece in pieces:
        indexer.feed(piece)
    return indexer.close()


def _read_all(data: bytes) -> str:
    """Everything the end-of-run readers give, as text (a NaN reads "nan" on both sides)."""
    diagnosis = failures.explain(data, "failed", 1, None)
    return repr(
        (
            failures._read(data, 0),
            candidates.candidate_lines(data, 0),
            diagnosis.failures,
            diagnosis.reason,
            diagnosis.parsed,
            candidates.holds_marker(data),
            console_record(data, ["python", "bench.py"], 0.0, 1.0),
        )
    )


def _need_hyperscan() -> None:
    ci_support.need_module("hyperscan", "pip install hyperscan (a dependency of gpuledger on x86-64 Linux)")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=_logs, points=st.lists(st.integers(min_value=0), max_size=12))
def test_the_index_gives_what_scanning_the_log_gives(data: bytes, points: list[int]) -> None:
    _need_hyperscan()
    index = _index(_cuts(data, points))
    if not data:
        assert index is None
        return
    assert index is not None and index.size == len(data)
    expected = _read_all(data)
    with candidates.attached(data, index):
        assert candidates._index_of(data) is index
        assert _read_all(data) == expected


def test_the_index_is_used_and_spares_the_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    _need_hyperscan()
    data = b"".join(_PIECES[10:21]) * 500 + _HUGE[0]
    index = _index(_cuts(data, [5, 77, 4096, 70_001]), hold_b=candidates.MIN_B)
    assert index is not None and not index.every_line and index.marker is True
    expected = _read_all(data)
    monkeypatch.setattr(candidates, "_database", lambda: pytest.fail("scanned again"))
    with candidates.attached(data, index):
        assert _read_all(data) == expected
    assert candidates._index_of(data) is None  # detached on leaving
    assert candidates.holds_marker(data) is True


def test_no_index_where_it_cannot_be_exact() -> None:
    _need_hyperscan()
    assert _index([b"  1/3 0.5G\n" * 10]) is not None
    assert _index([b"  1/3 0.5G\n" * 10], hold_b=candidates.MIN_B) is None  # short: read line by line
    osc = _index([b"a\n" * 10, b"\x1b]0;t\x07\n", b"b\n"])
    assert osc is not None and osc.every_line and osc.marker is None
    data = b"x\n" * 10
    with candidates.attached(data, lineindex.LineIndex(len(data) - 1, 9)):  # not these bytes: ignored
        assert candidates._index_of(data) is None


def test_an_index_survives_its_file(tmp_path) -> None:
    _need_hyperscan()
    index = _index([b"  1/3 x\nEpoch\n", b"nan\nBenchmarks complete for y\n"])
    assert index is not None and index.lines
    path = str(tmp_path / "run.log.lines")
    lineindex.save(index, path)
    assert lineindex.load(path) == index
    with open(path, "ab") as fh:
        fh.write(b"\0")
    assert lineindex.load(path) is None  # not whole
    assert lineindex.load(str(tmp_path / "none")) is None


# -- through the relay: the real redaction, reads cut wherever the pipe cuts them -----------------


def _pump(
    chunks: list[bytes], log_path: str, log_flags: int = os.O_WRONLY | os.O_APPEND, max_b: int | None = None
) -> None:
    read_fd, write_fd = os.pipe()
    sink = os.open(os.devnull, os.O_WRONLY)
    log_fd = os.open(log_path, log_flags | os.O_CREAT, 0o600)
    done = threading.Thread(
        target=relay.pump,
        args=({read_fd: sink}, log_fd, Redactor.default().stream, lineindex.index_path(log_path), max_b),
    )
    done.start()
    try:
        for chunk in chunks:
            os.write(write_fd, chunk)
    finally:
        os.close(write_fd)
        done.join(timeout=120)
        os.close(sink)
        os.close(log_fd)
        os.close(read_fd)
    assert not done.is_alive()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=_logs, points=st.lists(st.integers(min_value=0), max_size=8))
def test_the_relay_index_of_the_redacted_log_reads_like_the_log(tmp_path_factory, data: bytes, points) -> None:
    _need_hyperscan()
    data = _HUGE[0] + b"\n" + data  # over candidates.MIN_B: the relay indexes it
    log_path = str(tmp_path_factory.mktemp("relay") / "run.log")
    _pump(_cuts(data, points), log_path)
    with open(log_path, "rb") as fh:
        log = fh.read()
    assert b"hunter2hunter2" not in log  # redacted: the index describes the stored bytes
    index = wrap._line_index(log_path, True)
    assert not os.path.exists(lineindex.index_path(log_path))  # read once, then removed
    assert index is not None and index.size == len(log)
    expected = _read_all(log)
    with candidates.attached(log, index):
        assert _read_all(log) == expected
    # as gpuledger run hands it over: the file mapped (every line read: the bytes), the same answers
    handed, truncated, kept = wrap._read_log(log_path, 64 << 20, index)
    assert not truncated and kept is index and handed[:] == log
    assert isinstance(handed, mmap.mmap) is not index.every_line
    # and the failure reader cuts its lines out of the mapping, never copying the log whole
    copied = mock.patch.object(failures, "whole", side_effect=AssertionError("the mapped log was copied"))
    with candidates.attached(handed, kept), copied if isinstance(handed, mmap.mmap) else contextlib.nullcontext():
        assert _read_all(handed) == expected


def test_a_capped_log_or_a_relay_still_running_is_read_the_usual_way(tmp_path) -> None:
    _need_hyperscan()
    log_path = str(tmp_path / "run.log")
    _pump([_HUGE[0], b"\nEpoch\n"], log_path)
    path = lineindex.index_path(log_path)
    assert os.path.exists(path)
    assert wrap._line_index(log_path, False) is None  # the relay may still write
    assert os.path.exists(path)  # left for it
    assert wrap._read_log(log_path, 64 << 20, None)[0] == _HUGE[0] + b"\nEpoch\n"  # read, not mapped
    index = wrap._line_index(log_path, True)
    assert index is not None and not os.path.exists(path)
    log, truncated, kept = wrap._read_log(log_path, 64 << 10, index)  # over the cap: head and tail
    assert truncated and isinstance(log, bytes) and kept is None
    with open(log_path, "ab") as fh:  # the file is not what the index describes: read, index kept for the check
        fh.write(b"more\n")
    log, truncated, kept = wrap._read_log(log_path, 64 << 20, index)
    assert isinstance(log, bytes) and not truncated and len(log) != index.size


def test_a_log_the_relay_could_not_write_gets_no_index(tmp_path) -> None:
    _need_hyperscan()
    log_path = str(tmp_path / "run.log")
    _pump([_HUGE[0], b"\nEpoch\n"], log_path, os.O_RDONLY)  # every write fails
    assert not os.path.exists(lineindex.index_path(log_path))


def test_a_log_over_the_cap_gets_no_index(tmp_path) -> None:
    """Such a log is stored capped (read the usual way): the relay keeps no index of it in memory."""
    _need_hyperscan()
    data = b"  1/3 0.5G\n" * 20_000
    assert _index([data], hold_b=0) is not None
    assert _index([data[:100_000], data[100_000:]], hold_b=0) is not None
    indexer = lineindex.LineIndexer(0, max_b=150_000)
    indexer.feed(data[:100_000])
    indexer.feed(data[100_000:])
    assert indexer.close() is None
    log_path = str(tmp_path / "run.log")
    _pump([data], log_path, max_b=len(data) - 1)
    assert not os.path.exists(lineindex.index_path(log_path))
    at_cap = str(tmp_path / "at_cap.log")
    _pump([data], at_cap, max_b=len(data))  # at the cap: stored whole
    index = lineindex.load(lineindex.index_path(at_cap))
    assert index is not None and index.size == len(data)


@pytest.mark.parametrize(("cap", "indexed"), [("64KiB", False), ("1MiB", True)])
def test_the_forked_relay_keeps_no_index_of_a_log_over_the_cap(
    tmp_path, monkeypatch: pytest.MonkeyPatch, cap: str, indexed: bool
) -> None:
    _need_hyperscan()
    monkeypatch.setenv("GPULEDGER_LOG_MAX_B", cap)
    log_path = str(tmp_path / "run.log")
    read_fd, write_fd = os.pipe()
    sink = os.open(os.devnull, os.O_WRONLY)
    pid = relay.start_relay({read_fd: sink}, log_path, close_in_child=[write_fd])
    os.close(read_fd)
    try:
        os.write(write_fd, b"  1/3 0.5G\n" * 10_000)  # 110,000 bytes
    finally:
        os.close(write_fd)
        _, status = os.waitpid(pid, 0)  # it ends when its source does
        os.close(sink)
    assert os.waitstatus_to_exitcode(status) == 0
    assert os.path.exists(lineindex.index_path(log_path)) is indexed


_INDEXING_RELAY = """
import os, sys
from gpuledger.core.redaction.redact import Redactor
from gpuledger.recorder.relay import pump
log = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
pump({0: 1}, log, Redactor.default().stream, sys.argv[1] + ".lines", None)
print("\\n".join(sorted(sys.modules)), file=sys.stderr)
"""


def test_the_relay_indexes_the_log_without_loading_the_failure_patterns_or_the_log_parser(tmp_path) -> None:
    """Its patterns need only the failure words (failure_words.py): the patterns and the parser
    behind them are the end-of-run reader's, loaded once CMD has ended, not in every chatty relay."""
    _need_hyperscan()
    log_path = str(tmp_path / "run.log")
    output = b"        1/3      0.5G      1.234: 100%|##| 4/4\nKilled\n" * 3000
    done = subprocess.run(
        [sys.executable, "-c", _INDEXING_RELAY, log_path], input=output, capture_output=True, check=True
    )
    index = lineindex.load(lineindex.index_path(log_path))
    assert index is not None and index.size == len(output) and len(index.lines) == 2 * 6000
    loaded = set(done.stderr.decode().split())
    assert "gpuledger.core.training.lineindex" in loaded
    assert not loaded & {"gpuledger.core.training.failures", "gpuledger.core.training.logparse"}
