"""``gpuledger run`` at the front door, with real processes: what a failed launch leaves behind, a
forwarded signal the command survives, and a spooled run finding its way to the ledger it asked for."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from e2e_helpers import GPULEDGER, cli_env, py, run_cli, runs_json, show_json

pytestmark = pytest.mark.slow


def _sockets() -> set[str]:
    folder = Path(tempfile.gettempdir()) / f"gpuledger-{os.getuid()}"
    return {p.name for p in folder.glob("*.sock")} if folder.is_dir() else set()


def test_a_command_that_cannot_start_is_a_recorded_failed_run(tmp_path: Path) -> None:
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db")
    sockets = _sockets()
    out = run_cli(["run", "--label", "k=v", "--", "no-such-command-gpuledger-test", "train"], env)
    assert out.returncode == 127 and b"cannot start 'no-such-command-gpuledger-test'" in out.stderr
    assert b"Traceback" not in out.stderr
    logs = tmp_path / "home" / "logs"
    assert not logs.exists() or list(logs.iterdir()) == []  # no orphan log file: the log is in the ledger
    assert _sockets() <= sockets  # nor a control socket
    (row,) = runs_json(env)
    assert row["status"] == "failed"
    shown = show_json(row["id"], env)
    assert shown["exit_code"] == 127 and shown["labels"]["k"] == "v"
    assert shown["status_reason"] == "cannot start 'no-such-command-gpuledger-test': not found"
    assert shown["command"] == ["no-such-command-gpuledger-test", "train"]
    logs_out = run_cli(["logs", row["id"]], env)
    assert logs_out.returncode == 0 and logs_out.stdout == b""  # its log: empty, but there
    failures = run_cli(["query", "failures", "--json"], env)
    assert failures.returncode == 0, failures.stderr.decode()
    report = json.loads(failures.stdout)
    assert report["runs"] == 1 and report["by_status"] == {"failed": 1}


def test_a_failed_launch_with_a_server_waits_in_the_outbox_like_any_run(tmp_path: Path) -> None:
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db", GPULEDGER_TOKEN="glt_test")
    server = "http://127.0.0.1:9"  # nothing listens there: the push fails, the run must wait
    out = run_cli(["run", "-q", "--server", server, "--", "no-such-command-gpuledger-test"], env)
    assert out.returncode == 127 and out.stderr.startswith(b"gpuledger: cannot start")  # said first
    (row,) = runs_json(env)
    status = run_cli(["sync", "--status", "--server", server], env)
    assert status.returncode == 0, status.stderr.decode()
    assert row["id"] in status.stdout.decode()  # in the outbox: gpuledger sync pushes it later


def test_a_failed_launch_the_ledger_cannot_take_is_spooled_and_recovered(tmp_path: Path) -> None:
    asked = tmp_path / "asked.db"
    asked.mkdir()  # a folder where the ledger should be: it cannot be opened now
    env = cli_env(tmp_path / "home", str(tmp_path / "other.db"))
    out = run_cli(["run", "-q", "--db", str(asked), "--", "no-such-command-gpuledger-test"], env)
    assert out.returncode == 127 and b"gpuledger recover" in out.stderr
    asked.rmdir()
    assert run_cli(["recover"], env).returncode == 0
    env["GPULEDGER_DB"] = str(asked)
    (row,) = runs_json(env)
    assert (row["status"], show_json(row["id"], env)["exit_code"]) == ("failed", 127)


@pytest.mark.parametrize(
    ("content", "mode", "cause"),
    [
        (b"#!/bin/sh\necho hi\n", 0o644, "permission denied"),  # not marked executable
        (b"\x7fELF not really a program", 0o755, "not executable"),  # marked, but the kernel cannot load it
    ],
)
def test_a_command_that_cannot_be_run_is_a_failed_run_with_126(
    tmp_path: Path, content: bytes, mode: int, cause: str
) -> None:
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db")
    program = tmp_path / "train.sh"
    program.write_bytes(content)
    program.chmod(mode)
    out = run_cli(["run", "--", str(program)], env)
    assert out.returncode == 126 and b"cannot start" in out.stderr and b"Traceback" not in out.stderr
    (row,) = runs_json(env)
    shown = show_json(row["id"], env)
    assert (row["status"], shown["exit_code"]) == ("failed", 126)
    assert shown["status_reason"].startswith(f"cannot start {str(program)!r}: {cause}")


TRAPPER = textwrap.dedent(
    """
    import signal, sys, time
    def stop(signum, frame):
        print("checkpoint saved", flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    time.sleep(60)
    """
)


def test_a_forwarded_signal_the_command_handles_is_still_named(tmp_path: Path) -> None:
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db")
    proc = subprocess.Popen([*GPULEDGER, "run", "--interval", "0.5", "--", *py(TRAPPER)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        proc.send_signal(signal.SIGTERM)  # to gpuledger, which forwards it to the command
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 3 and b"checkpoint saved" in stdout  # the command's own exit code
    run = runs_json(env)[0]
    shown = json.loads(run_cli(["show", run["short_id"], "--json"], env).stdout)
    assert shown["status"] == "failed" and shown["exit_code"] == 3
    assert shown["status_reason"] == "exited with code 3 after SIGTERM (forwarded by gpuledger)"
    assert b"after SIGTERM (forwarded by gpuledger)" in stderr  # in the end-of-run summary too


def test_recover_writes_a_spooled_run_into_the_ledger_it_asked_for(tmp_path: Path) -> None:
    asked = tmp_path / "team" / "ledger.db"
    asked.mkdir(parents=True)  # a folder where the file should be: the ledger cannot be opened now
    other = f"sqlite:///{tmp_path}/default.db"
    env = cli_env(tmp_path / "home", other)
    out = run_cli(["run", "--db", str(asked), "--interval", "0.5", "--",
                   *py("import time; print('trained'); time.sleep(1.2)")], env)  # fmt: skip
    assert out.returncode == 0 and b"trained" in out.stdout and b"gpuledger recover" in out.stderr
    spooled = list((tmp_path / "home" / "spool").glob("*.json"))
    assert len(spooled) == 1
    too_early = run_cli(["recover"], env)  # still unavailable: said once, the spooled run kept
    assert too_early.returncode == 1 and b"Traceback" not in too_early.stderr
    assert spooled[0].exists() and too_early.stderr.startswith(f"Error: {spooled[0]}: cannot open".encode())
    asked.rmdir()  # the ledger is back
    recovered = run_cli(["recover"], env)  # GPULEDGER_DB points at another ledger: the run must not go there
    assert recovered.returncode == 0, recovered.stderr.decode()
    assert f"into sqlite:///{asked}".encode() in recovered.stdout
    assert not (tmp_path / "default.db").exists()  # the default ledger got nothing
    env["GPULEDGER_DB"] = str(asked)
    runs = runs_json(env)
    assert len(runs) == 1 and runs[0]["status"] == "succeeded"
    assert run_cli(["logs", runs[0]["short_id"]], env).stdout.strip() == b"trained"
    assert not list((tmp_path / "home" / "spool").glob("*.json"))


def test_run_refuses_a_ledger_that_can_never_work_before_the_command_starts(tmp_path: Path) -> None:
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db")
    marker = tmp_path / "started"
    began = time.monotonic()
    out = run_cli(["run", "--db", "foo://bar", "--", *py(f"open({str(marker)!r}, 'w'); import time; time.sleep(30)")],
                  env)  # fmt: skip
    assert out.returncode == 2 and not marker.exists()
    assert out.stderr.decode().count("Error:") == 1 and b"unsupported database foo://bar" in out.stderr
    assert time.monotonic() - began < 25  # refused, not run to the end and spooled
    assert not (tmp_path / "home" / "spool").exists()


def test_the_end_of_run_summary_reads_plainly(tmp_path: Path) -> None:
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db")
    out = run_cli(["run", "--replay-gpus", "a100x2-example", "--interval", "0.5", "--",
                   *py("import time; time.sleep(1.5)")], env)  # fmt: skip
    text = out.stderr.decode()
    assert out.returncode == 0, text
    assert not re.search(r"\de-\d\d\b", text)  # tiny GPU-hours and kWh in plain decimals, no 7.8e-05
    run = runs_json(env)[0]
    title = next(line for line in text.splitlines() if line.startswith("run "))
    assert title.startswith(f"run {run['id']} ({run['short_id']})")  # the id to type next
