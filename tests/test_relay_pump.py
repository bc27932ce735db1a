"""The output relay's loop on real pipes and a real pty: what CMD writes reaches the terminal byte
for byte, and the log file gets the redacted copy, however the writes are cut (a secret split
between two writes with a pause between them is still redacted), and soon after CMD pauses."""

from __future__ import annotations

import contextlib
import os
import pty
import random
import re
import signal
import threading
import time
import tty
from pathlib import Path

import pytest

from gpuledger.core.redaction.redact import Redactor
from gpuledger.recorder.relay import pump

R = Redactor.default()


def _output(size: int, seed: int = 3) -> bytes:
    """Training-like output: progress redraws, log lines, a colour code, secrets, binary bytes."""
    rnd = random.Random(seed)
    parts: list[bytes] = []
    total = 0
    while total < size:
        kind = rnd.random()
        if kind < 0.6:
            bar = b"\r  %d/50  1.2G  %.4f  %3d%%|\xe2\x96\x88\xe2\x96\x88  | %d/400 [00:%02d<00:30]"
            part = b"".join(bar % (i // 8, rnd.random(), i // 4, i, i % 60) for i in range(40)) + b"\n"
        elif kind < 0.8:
            part = b"step %d | loss %.3f | tokens/s %d | key_dim 64\n" % (total, rnd.random(), rnd.randint(1, 99999))
        elif kind < 0.9:
            noise = bytes(rnd.randrange(256) for _ in range(20)).replace(b"\x1b", b"")
            part = b"\x1b[33mwarning\x1b[0m: https://example.com/x -- %s\n" % noise
        else:
            part = rnd.choice(
                [
                    b"export HF_TOKEN=hf_" + b"AbCdEfGhIjKlMnOpQrStUvWxYz%08d\n" % rnd.randint(0, 10**8),
                    b"db=postgresql://ml:pw%d@db.internal/runs\n" % rnd.randint(0, 999),
                    b"curl -H 'Authorization: Bearer tok%d' https://api\n" % rnd.randint(0, 999),
                ]
            )
        parts.append(part)
        total += len(part)
    return b"".join(parts)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _writer(fd: int, data: bytes, seed: int, split_secret: bytes) -> threading.Thread:
    """Write ``data`` in pieces of random size with small pauses, then ``split_secret`` in two
    writes with a pause between, then close ``fd``."""

    def run() -> None:
        rnd = random.Random(seed)
        view = memoryview(data)
        while view:
            n = rnd.randint(1, 70_000)
            _write_all(fd, view[:n])
            view = view[n:]
            if rnd.random() < 0.05:
                time.sleep(0.03)  # longer than the relay's quiet time: the log batch is written
        half = len(split_secret) // 2
        _write_all(fd, split_secret[:half])
        time.sleep(0.1)
        _write_all(fd, split_secret[half:])
        os.close(fd)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _collector(fd: int) -> tuple[threading.Thread, list[bytes]]:
    got: list[bytes] = []

    def run() -> None:
        while chunk := os.read(fd, 1 << 16):
            got.append(chunk)
        os.close(fd)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got


SPLIT = b"export MY_API_KEY=s3cr3t-value-that-spans-two-writes\n"


def _run_pump(sources: dict[int, int], log: Path) -> None:
    log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        pump(sources, log_fd, R.stream)
    finally:
        os.close(log_fd)


def _lines(data: bytes) -> list[bytes]:
    return sorted(re.findall(rb"[^\r\n]*(?:\r\n|[\r\n])|[^\r\n]+\Z", data))


def test_pipes_pass_bytes_unchanged_and_log_the_redacted_copy(tmp_path: Path) -> None:
    out_data, err_data = _output(1_500_000, seed=1), _output(300_000, seed=2)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    term_out_r, term_out_w = os.pipe()
    term_err_r, term_err_w = os.pipe()
    collect_out, got_out = _collector(term_out_r)
    collect_err, got_err = _collector(term_err_r)
    writers = [_writer(out_w, out_data, 5, SPLIT), _writer(err_w, err_data, 6, b"")]
    _run_pump({out_r: term_out_w, err_r: term_err_w}, tmp_path / "run.log")
    for fd in (out_r, err_r, term_out_w, term_err_w):
        os.close(fd)
    for thread in [*writers, collect_out, collect_err]:
        thread.join(30)
    assert b"".join(got_out) == out_data + SPLIT
    assert b"".join(got_err) == err_data
    log = (tmp_path / "run.log").read_bytes()
    # Whole lines of each stream, each redacted as in its own stream: none cut by the other.
    assert _lines(log) == _lines(R.redact_bytes(out_data + SPLIT) + R.redact_bytes(err_data))
    assert b"s3cr3t-value" not in log and b"hf_AbCdEf" not in log


def test_a_pty_passes_bytes_unchanged_and_logs_the_redacted_copy(tmp_path: Path) -> None:
    data = _output(1_500_000, seed=4)
    master, slave = pty.openpty()
    tty.setraw(slave)  # the bytes as written; a cooked pty would turn \n into \r\n on both copies
    term_r, term_w = os.pipe()
    collect, got = _collector(term_r)
    writer = _writer(slave, data, 7, SPLIT)
    _run_pump({master: term_w}, tmp_path / "run.log")
    os.close(master)
    os.close(term_w)
    writer.join(30)
    collect.join(30)
    assert b"".join(got) == data + SPLIT
    assert (tmp_path / "run.log").read_bytes() == R.redact_bytes(data + SPLIT)


def test_one_source_log_is_the_whole_redaction(tmp_path: Path) -> None:
    data = _output(800_000, seed=8)
    r, w = os.pipe()
    term_r, term_w = os.pipe()
    collect, got = _collector(term_r)
    writer = _writer(w, data, 9, SPLIT)
    _run_pump({r: term_w}, tmp_path / "run.log")
    os.close(r)
    os.close(term_w)
    writer.join(30)
    collect.join(30)
    assert b"".join(got) == data + SPLIT
    assert (tmp_path / "run.log").read_bytes() == R.redact_bytes(data + SPLIT)


def test_the_log_catches_up_while_cmd_pauses(tmp_path: Path) -> None:
    """The file is the copy that survives gpuledger: it must not wait for the end of the run."""
    r, w = os.pipe()
    term_r, term_w = os.pipe()
    collect, _ = _collector(term_r)
    log = tmp_path / "run.log"
    relay = threading.Thread(target=_run_pump, args=({r: term_w}, log), daemon=True)
    relay.start()
    os.write(w, b"epoch 1 done, HF_TOKEN=abc123\n")
    deadline = time.monotonic() + 20
    while (not log.exists() or b"epoch 1" not in log.read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log.read_bytes() == b"epoch 1 done, HF_TOKEN=[REDACTED:env-secret]\n"  # CMD still running
    os.close(w)
    relay.join(30)
    os.close(r)
    os.close(term_w)
    collect.join(30)


def test_a_closed_terminal_keeps_the_log_going(tmp_path: Path) -> None:
    data = _output(300_000, seed=10)
    r, w = os.pipe()
    term_r, term_w = os.pipe()
    os.close(term_r)  # the terminal went away: writes to it fail with EPIPE
    writer = _writer(w, data, 11, SPLIT)
    previous = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        _run_pump({r: term_w}, tmp_path / "run.log")
    finally:
        signal.signal(signal.SIGPIPE, previous)
    os.close(r)
    os.close(term_w)
    writer.join(30)
    assert (tmp_path / "run.log").read_bytes() == R.redact_bytes(data + SPLIT)


@pytest.mark.parametrize("size", [1, 4095, 4096, 70_000, 1 << 20])
def test_any_single_write_size_gets_through(tmp_path: Path, size: int) -> None:
    data = (b"x" * (size - 1) + b"\n") if size > 1 else b"\n"
    r, w = os.pipe()
    term_r, term_w = os.pipe()
    collect, got = _collector(term_r)
    writer = _writer(w, data, 12, b"")
    _run_pump({r: term_w}, tmp_path / "run.log")
    os.close(r)
    os.close(term_w)
    writer.join(30)
    collect.join(30)
    assert b"".join(got) == data
    assert (tmp_path / "run.log").read_bytes() == data


def test_descriptors_numbered_past_1024_are_relayed(tmp_path: Path) -> None:
    """The relay inherits the numbering of the process that started the run (a server, a long
    session with many files open): select() cannot watch a descriptor >= 1024, poll can."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2100:  # raise our own limit if the machine allows it; the environment decides, not the code
        if hard != resource.RLIM_INFINITY and hard < 2100:
            pytest.skip(f"this machine allows {hard} open files, the test needs descriptors past 2048")
        resource.setrlimit(resource.RLIMIT_NOFILE, (2100, hard))
    data = _output(200_000, seed=9)
    src_r, src_w = os.pipe()
    term_r, term_w = os.pipe()
    high_src, high_term = 2040, 2041
    os.dup2(src_r, high_src)
    os.dup2(term_w, high_term)
    os.close(src_r)
    os.close(term_w)
    try:
        collect, got = _collector(term_r)
        writer = _writer(src_w, data, 4, SPLIT)
        _run_pump({high_src: high_term}, tmp_path / "run.log")
        writer.join(10)
    finally:
        for fd in (high_src, high_term):
            with contextlib.suppress(OSError):
                os.close(fd)
        if soft < 2100:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    collect.join(10)
    assert b"".join(got) == data + SPLIT
    assert b"s3cr3t-value" not in (tmp_path / "run.log").read_bytes()
