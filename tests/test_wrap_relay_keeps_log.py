"""A command whose background child outlives it, under a real ``gpuledger run``: the child still
holds the command's output, so the relay is still running when gpuledger archives the run
(recorder/wrap.py, ``_wait_relay``). gpuledger says so, and keeps the on-disk log, the only place the
child's later output goes.

The normal case (no such child: the file is removed once archived) is asserted by
tests/test_relay_e2e.py::test_a_chatty_run_prints_what_the_command_prints_and_stores_one_capped_redacted_log
(``assert not any((tmp_path / "home" / "logs").iterdir())``), so it is not repeated here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from e2e_helpers import GPULEDGER, cli_env, only_run, py, run_cli
from gpuledger.recorder.wrap import RELAY_GRACE_S

pytestmark = pytest.mark.slow

STILL_HOLDS = b"gpuledger: CMD ended but a process it started still holds its output"

# CMD prints a line, forks and exits at once. The forked child inherits CMD's stdout (the relay's
# pipe) and writes its line only when the test creates the "go" file, after gpuledger has returned:
# so the late line can only reach the file on disk, never the archived copy. Its own deadline ends
# it should the test die before saying go.
LINGERING = textwrap.dedent(
    """
    import os, sys, time
    go, pid_file = sys.argv[1], sys.argv[2]
    print("early-line", flush=True)  # flushed before the fork: the child must not print it again
    pid = os.fork()
    if pid == 0:
        deadline = time.monotonic() + 60
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.02)
        print("late-line", flush=True)
        os._exit(0)
    with open(pid_file, "w") as fh:  # written before CMD ends, so the test can always clean up
        fh.write(str(pid))
    """
)


def _stop(pid: int) -> None:
    """Kill the lingering child and reap it if it came back to us (a subreaper test process)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


class Lingering:
    """`gpuledger run` of LINGERING, its child held until ``release``; cleans up whatever happens."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        self.go, self.pid_file = tmp_path / "go", tmp_path / "grandchild.pid"
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Lingering:
        # Pipes, not a terminal: gpuledger's stdout and stderr are inherited by the relay, so they
        # only reach EOF once the relay ends, and that is after the lingering child exits.
        self.proc = subprocess.Popen(
            [*GPULEDGER, "run", "-q", "--no-gpu", "--", *py(LINGERING), str(self.go), str(self.pid_file)],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        return self

    def wait(self) -> int:
        """gpuledger's exit status. Waits for gpuledger itself, not for its pipes (communicate would
        block until the child ends); the output is a few lines, so the unread pipes cannot stall it."""
        assert self.proc is not None
        return self.proc.wait(timeout=RELAY_GRACE_S + 60)

    def release(self) -> tuple[bytes, bytes]:
        """Let the child write its line and exit; (stdout, stderr) once the relay has drained it."""
        assert self.proc is not None
        self.go.touch()
        return self.proc.communicate(timeout=30)  # EOF: the relay has ended and closed the log

    def __exit__(self, *exc: object) -> None:
        self.go.touch()
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.communicate(timeout=10)
        if self.pid_file.exists():
            _stop(int(self.pid_file.read_text()))


def test_a_child_that_outlives_the_command_keeps_the_log_on_disk(tmp_path: Path) -> None:
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db")
    with Lingering(tmp_path, env) as cmd:
        assert cmd.wait() == 0
        logs = list((tmp_path / "home" / "logs").iterdir())
        assert len(logs) == 1  # kept: gpuledger gave up waiting for the relay
        log = logs[0]
        assert b"late-line" not in log.read_bytes()
        stdout, stderr = cmd.release()

    assert STILL_HOLDS in stderr, stderr.decode()
    assert str(log).encode() in stderr  # where the rest of the output goes
    assert stdout == b"early-line\nlate-line\n"  # the terminal got both lines, in order
    assert log.exists()
    assert log.read_bytes() == b"early-line\nlate-line\n"  # the late line went to the kept file

    run = only_run(env)
    assert run["status"] == "succeeded"
    assert log.name == f"{run['id']}.log"
    archived = run_cli(["logs", run["id"]], env)
    assert archived.returncode == 0, archived.stderr.decode()
    assert archived.stdout == b"early-line\n"  # archived before the late line was written


def test_a_spooled_run_whose_child_outlives_it_keeps_the_log_through_recover(tmp_path: Path) -> None:
    # The same child, and the ledger unreachable at the end: the run goes to the spool. `recover`
    # later stores the log but must leave the file, which the child may still be writing.
    env = cli_env(tmp_path / "home", "postgresql://nobody@127.0.0.1:1/gone")
    good = f"sqlite:///{tmp_path}/ledger.db"
    with Lingering(tmp_path, env) as cmd:
        assert cmd.wait() == 0
        recovered = run_cli(["recover", "--db", good], env)
        assert recovered.returncode == 0, recovered.stderr.decode()
        logs = list((tmp_path / "home" / "logs").iterdir())
        assert len(logs) == 1  # recovered, and still there for the child's later output
        _, stderr = cmd.release()

    assert b"gpuledger recover" in stderr and STILL_HOLDS in stderr
    assert logs[0].read_bytes() == b"early-line\nlate-line\n"
    env["GPULEDGER_DB"] = good
    run = only_run(env)
    assert run["status"] == "succeeded"
    assert run_cli(["logs", run["id"]], env).stdout == b"early-line\n"
