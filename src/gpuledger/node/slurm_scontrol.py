"""Running ``scontrol`` with a time limit: a hung slurmctld or slurmstepd costs at most that limit.

Each call starts ``scontrol`` in a process group of its own and, past the limit, kills the whole
group (a wrapper script's children too), so nothing is left holding the agent's pipes. The answer
is a ``CallResult``: what it printed, or one line saying why there is nothing to read.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

MAX_WHY = 200  # characters of scontrol's own error message kept in a status line


@dataclass(frozen=True)
class CallResult:
    ok: bool
    stdout: str = ""
    stderr: str = ""
    rc: int | None = None
    why: str | None = None  # one line when not ok: "timed out after 5 s", "exit 1: <its message>"
    timed_out: bool = False

    def message(self) -> str:
        """scontrol's own first line of complaint (stderr, else stdout)."""
        for text in (self.stderr, self.stdout):
            for line in text.splitlines():
                if line.strip():
                    return line.strip()[:MAX_WHY]
        return ""


class Scontrol:
    """``scontrol`` as found on the agent's PATH, run with a time limit."""

    def __init__(self, env: Mapping[str, str], timeout_s: float) -> None:
        self._env = dict(env)
        self.timeout_s = timeout_s

    def path(self) -> str | None:
        return shutil.which("scontrol", path=self._env.get("PATH", os.defpath))

    def run(self, *args: str) -> CallResult:
        path = self.path()
        if path is None:
            return CallResult(False, why="scontrol not found on PATH")
        try:
            proc = subprocess.Popen(
                [path, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._env,
                start_new_session=True,  # its own process group: killed whole on a timeout
            )
        except OSError as exc:
            return CallResult(False, why=f"cannot run {path}: {exc.strerror or exc}")
        try:
            out, err = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return CallResult(False, rc=None, why=f"timed out after {self.timeout_s:g} s", timed_out=True)
        result = CallResult(
            ok=proc.returncode == 0,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
            rc=proc.returncode,
        )
        if result.ok:
            return result
        said = result.message()
        code = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
        return CallResult(False, result.stdout, result.stderr, proc.returncode, f"{code}: {said}" if said else code)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=2.0)
    except subprocess.TimeoutExpired:  # a child left the group and holds the pipes: stop reading them
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait(timeout=2.0)
