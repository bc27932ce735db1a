"""Ctrl-C and ``gpuledger logs`` on a terminal, with real processes: an interrupted command exits
130 with one short line (no traceback, no click "Aborted!"), and a log's escape sequences reach a
terminal as text, not as orders (a screen clear, a window title), unless --raw asks for the bytes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from e2e_helpers import GPULEDGER, cli_env, py, run_cli, runs_json

pytestmark = pytest.mark.slow

CLEAR, TITLE, RED, RESET = b"\x1b[2J\x1b[H", b"\x1b]0;pwned\x07", b"\x1b[1;31m", b"\x1b[0m"
NASTY = CLEAR + b"epoch 1/3\r" + TITLE + RED + b"loss 0.5" + RESET + b"\n\tbinary:\xff\xc2\x9b\x00end\n"


def test_ctrl_c_in_a_waiting_command_exits_130_without_a_traceback(tmp_path: Path) -> None:
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db", GPULEDGER_TOKEN="t")
    with socket.socket() as server:  # a team server that takes the request and never answers
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(60)
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        proc = subprocess.Popen([*GPULEDGER, "runs", "--server", url], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        try:
            conn, _ = server.accept()  # the command is now waiting for the answer
            with conn:
                conn.recv(1024)
                proc.send_signal(signal.SIGINT)
                _, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 130, stderr.decode()
    assert b"Traceback" not in stderr and b"Aborted" not in stderr
    assert stderr.strip() == b"gpuledger: interrupted"


def _record(tmp_path: Path) -> tuple[dict[str, str], str]:
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db")
    code = f"import sys; sys.stdout.buffer.write({NASTY!r}); sys.stdout.flush()"
    out = run_cli(["run", "-q", "--", *py(code)], env)  # piped: no pty, the bytes stored as written
    assert out.returncode == 0, out.stderr.decode()
    (row,) = runs_json(env)
    return env, row["id"]


def _logs_on_a_terminal(args: list[str], env: dict[str, str]) -> bytes:
    """What ``gpuledger logs`` writes when its stdout is a terminal (a pty, read until it closes)."""
    master, slave = os.openpty()
    proc = subprocess.Popen([*GPULEDGER, "logs", *args], env=env, stdout=slave, stderr=subprocess.PIPE)
    os.close(slave)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(master)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr.decode()
    return b"".join(chunks).replace(b"\r\n", b"\n")  # the terminal's own newline translation


def test_logs_to_a_terminal_shows_escapes_as_text_and_keeps_colours(tmp_path: Path) -> None:
    env, run_id = _record(tmp_path)
    shown = _logs_on_a_terminal([run_id], env)
    assert CLEAR not in shown and b"\x1b[2J" not in shown and b"\x1b]" not in shown and b"\x07" not in shown
    assert b"\\x1b[2J\\x1b[H" in shown and b"\\x1b]0;pwned\\x07" in shown  # visible, harmless
    assert RED + b"loss 0.5" + RESET in shown  # colours are kept
    assert b"epoch 1/3\r" in shown and b"\n\tbinary:" in shown  # \r, \n and \t too
    assert b"\\xff\\x9b\\x00end" in shown and b"\xff" not in shown and b"\xc2\x9b" not in shown


def test_logs_raw_and_piped_give_the_bytes_as_stored(tmp_path: Path) -> None:
    env, run_id = _record(tmp_path)
    assert NASTY.replace(b"\r\n", b"\n") in _logs_on_a_terminal([run_id, "--raw"], env)
    piped = run_cli(["logs", run_id], env)
    assert piped.returncode == 0 and piped.stdout == NASTY


def test_logs_of_a_run_that_printed_nothing_says_so(tmp_path: Path) -> None:
    """Nothing on stdout and nothing said would look like a log that could not be read."""
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db")
    assert run_cli(["run", "-q", "--", *py("pass")], env).returncode == 0
    (row,) = runs_json(env)
    out = run_cli(["logs", row["id"]], env)
    assert (out.returncode, out.stdout) == (0, b"")
    assert out.stderr.decode() == f"gpuledger: run {row['id']} printed nothing: its log is empty\n"
