"""A chatty command under a real ``gpuledger run``: what reaches the terminal is what the command
printed, byte for byte, on pipes and on a pty; the ledger keeps one redacted, capped copy of the
log (the relay's file is removed once it is archived), and ``gpuledger logs`` says it was cut."""

from __future__ import annotations

import hashlib
import os
import pty
import re
import subprocess
import textwrap
import tty
from collections import Counter
from pathlib import Path

import pytest

from e2e_helpers import GPULEDGER, cli_env, only_run, py, run_cli
from gpuledger.core.redaction.redact import Redactor
from gpuledger.core.training.logcap import find_cut
from gpuledger.store import Ledger

pytestmark = pytest.mark.slow

R = Redactor.default()
SECRETS = [b"hf_" + b"AbCdEfGhIjKlMnOpQrStUvWxYz01234567", b"s3cr3t-db-pw", b"9f8e7d6c5b4a3210fedcba"]

# About 4 MB: progress bars redrawn with \r, metric rows, a long config line, secrets early, in the
# middle and at the end, a few lines on stderr; written in pieces of varying size.
CHATTY = textwrap.dedent(
    """
    import random, sys
    rnd = random.Random(11)
    out, err = sys.stdout.buffer, sys.stderr.buffer
    def secrets(n):
        out.write(b"export HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567\\n")
        out.write(b"db=postgresql://ml:s3cr3t-db-pw@db.internal:5432/runs attempt %d\\n" % n)
        out.write(b"retrying with bearer 9f8e7d6c5b4a3210fedcba\\n")
    secrets(0)
    for epoch in range(1, 70):
        bar = b"".join(
            b"\\r  %3d/69   3.2G   %.4f   %.4f  %3d%%|\\xe2\\x96\\x88\\xe2\\x96\\x8c   | %d/600 [00:%02d<00:40]"
            % (epoch, rnd.random(), rnd.random(), i // 6, i, i % 60) for i in range(600)
        )
        for i in range(0, len(bar), 5000):
            out.write(bar[i:i + 5000])
        out.write(b"\\nstep %d | loss %.4f | tokens/s %d\\n" % (epoch, rnd.random(), rnd.randint(1000, 9999)))
        if epoch == 30:
            out.write(b"config: {" + b", ".join(b'"layer_%d_key_dim": 64' % i for i in range(3000)) + b"}\\n")
            secrets(epoch)
        if epoch % 20 == 0:
            err.write(b"warning: epoch %d was slow\\n" % epoch)
            err.flush()
    secrets(99)
    out.flush()
    """
)


@pytest.fixture
def env(tmp_path: Path, ledger_url: str) -> dict[str, str]:
    return cli_env(tmp_path / "home", ledger_url, GPULEDGER_LOG_MAX_B="1MiB")


def _lines(data: bytes) -> list[bytes]:
    """Lines with their ends (\\n or \\r: a progress bar redraw is a line of the log too)."""
    return re.findall(rb"[^\r\n]*[\r\n]|[^\r\n]+\Z", data)


def _bare() -> tuple[bytes, bytes]:
    done = subprocess.run(py(CHATTY), capture_output=True, timeout=120)
    assert done.returncode == 0
    return done.stdout, done.stderr


def test_a_chatty_run_prints_what_the_command_prints_and_stores_one_capped_redacted_log(
    env: dict[str, str], ledger_url: str, tmp_path: Path
) -> None:
    bare_out, bare_err = _bare()
    assert len(bare_out) > 3_000_000 and all(s in bare_out for s in SECRETS)
    wrapped = run_cli(["run", "-q", "--", *py(CHATTY)], env, timeout=300)
    assert wrapped.returncode == 0, wrapped.stderr.decode()
    assert wrapped.stdout == bare_out  # the terminal got every byte, unchanged
    assert bare_err in wrapped.stderr
    run = only_run(env)
    assert not any((tmp_path / "home" / "logs").iterdir())  # archived in the ledger, file removed

    shown = run_cli(["logs", run["id"]], env)
    assert shown.returncode == 0
    stored = shown.stdout
    assert len(stored) <= 1024 * 1024 and not any(s in stored for s in SECRETS)
    assert b"this log was cut" in shown.stderr and b"GPULEDGER_LOG_MAX_B" in shown.stderr
    cut = find_cut(stored)
    assert cut is not None
    # The log is the redacted output of both streams, in whole lines of each (stderr's lines land
    # between stdout's, wherever the relay read them), its head and its tail kept.
    out_lines, err_lines = _lines(R.redact_bytes(bare_out)), _lines(R.redact_bytes(bare_err))
    assert cut.total_b == sum(map(len, out_lines + err_lines))
    kept = _lines(stored[: cut.head_b]) + _lines(stored[len(stored) - cut.tail_b :])
    assert not Counter(kept) - Counter(out_lines + err_lines)  # every kept line is a whole output line
    assert stored.startswith(b"export HF_TOKEN=[REDACTED:huggingface-token]\n")
    assert b"retrying with bearer [REDACTED:bearer-token]\n" in stored[-1000:]

    with Ledger(ledger_url) as ledger:
        info = ledger.log_info(run["id"])
        assert info == {"sha256": hashlib.sha256(stored).hexdigest(), "size_b": len(stored), "truncated": True}


def _screen(argv: list[str], env: dict[str, str], *, raw: bool) -> tuple[int, bytes]:
    """Run ``argv`` with stdout and stderr on a new pty; what the terminal side reads."""
    master, slave = pty.openpty()
    if raw:
        tty.setraw(slave)
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    got = []
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: every writer is gone
            break
        if not chunk:
            break
        got.append(chunk)
    os.close(master)
    return proc.wait(timeout=300), b"".join(got)


def test_on_a_pty_the_terminal_gets_what_it_would_get_without_gpuledger(env: dict[str, str]) -> None:
    """Without gpuledger the command writes to a terminal (a cooked pty, \n shown as \r\n); under
    gpuledger it writes to gpuledger's pty, which passes its bytes as written, and the relay
    copies them to the same kind of terminal, which processes them once: the screen gets the
    same bytes (not \r\r\n), and the log the command's own \n."""
    code, bare = _screen(py(CHATTY), env, raw=False)
    assert code == 0 and b"\r\n" in bare
    code, wrapped = _screen([*GPULEDGER, "run", "-q", "--", *py(CHATTY)], env, raw=False)
    assert code == 0
    assert wrapped == bare
    log = run_cli(["logs", only_run(env)["id"]], env).stdout
    assert not any(s in log for s in SECRETS) and find_cut(log) is not None
    assert b"\r\n" not in log and b"\nstep 69 | loss" in log


def test_a_bad_log_cap_is_refused_before_the_command_starts(env: dict[str, str], tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    env = {**env, "GPULEDGER_LOG_MAX_B": "lots"}
    out = run_cli(["run", "--", *py(f"open({str(marker)!r}, 'w')")], env)
    assert out.returncode == 2
    assert out.stderr.decode().strip().splitlines() == [
        "gpuledger: GPULEDGER_LOG_MAX_B='lots': 'lots' is not a size (bytes, or a number with KiB, MiB or GiB)"
    ]
    assert not marker.exists()


# A YOLO training's output, well over a pipe's and the relay's buffers, that dies of a CUDA OOM;
# the second form is killed with SIGKILL in the middle of a progress bar.
TRAINING = textwrap.dedent(
    """
    import os, signal, sys
    out = sys.stdout.buffer
    head = b"\\n      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size\\n"
    for epoch in range(1, 41):
        out.write(head)
        for i in range(0, 401):
            out.write(b"\\r  %5d/40      3.2G      1.234      2.345      1.111         12        640: %3d%%|"
                      % (epoch, i // 4))
        out.write(b"\\n                 Class     Images  Instances      Box(P          R      mAP50  mAP50-95)\\n")
        out.write(b"                   all        128        929      0.512      0.433      0.%03d      0.3\\n" % epoch)
        if epoch == 20:
            out.write(b"password: hunter2hunter2\\n")
    out.flush()
    if sys.argv[1] == "kill":
        out.write(b"\\r      41/40      3.2G      1.234")
        out.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    out.write(b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0)\\n")
    sys.exit(1)
    """
)


@pytest.mark.parametrize("end", ["oom", "kill"])
def test_a_whole_log_is_stored_as_printed_redacted_and_read_as_the_stored_bytes_read(
    tmp_path: Path, ledger_url: str, end: str
) -> None:
    """Under the log cap the stored log is the redacted output itself, with its own sha256 (the
    seal's), and the run's end is explained from it as from those bytes (gpuledger run maps the
    relay's file instead of reading it: recorder/wrap.py)."""
    from gpuledger.core.training import failures

    env = cli_env(tmp_path / "home", ledger_url)
    bare = subprocess.run([*py(TRAINING), end], capture_output=True, timeout=120).stdout
    assert len(bare) > 1_000_000
    wrapped = run_cli(["run", "-q", "--", *py(TRAINING), end], env, timeout=300)
    assert wrapped.returncode == (137 if end == "kill" else 1), wrapped.stderr.decode()
    assert wrapped.stdout == bare
    run = only_run(env)
    assert not any((tmp_path / "home" / "logs").iterdir())  # archived in the ledger, file removed
    stored = run_cli(["logs", run["id"]], env).stdout
    assert stored == R.redact_bytes(bare) and b"hunter2hunter2" not in stored
    with Ledger(ledger_url) as ledger:
        info = ledger.log_info(run["id"])
        assert info == {"sha256": hashlib.sha256(stored).hexdigest(), "size_b": len(stored), "truncated": False}
        kinds = {e.kind for e in ledger.events(run["id"])}
        metrics = [(m.epoch, m.key, m.value) for m in ledger.metrics(run["id"])]
    signal_ = 9 if end == "kill" else None
    expected = failures.explain(stored, "failed", None if signal_ else 1, signal_)
    assert len(expected.parsed.epochs) >= 39  # the epochs the log shows, as its bytes give them
    assert metrics == [(e.epoch, k, v) for e in expected.parsed.epochs for k, v in e.metrics.items()]
    if end == "oom":
        assert "cuda_oom" in kinds and run["status_reason"] == expected.reason
    else:
        assert "SIGKILL" in run["status_reason"]
    assert "log_parsed" in kinds
