"""A real terminal of a fixed size for the CLI's screens: a detached tmux session on a private
socket, read back with ``capture-pane``. Without tmux the tests skip, and fail under CI=1."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable

from ci_support import missing

DONE = "__screen_done__"


def need_tmux() -> str:
    tmux = shutil.which("tmux")
    if tmux is None:
        missing("tmux", "apt-get install tmux")
    return tmux  # type: ignore[return-value]


class Terminal:
    """One tmux server of our own (``-L``), its sessions ``width`` x ``height``."""

    def __init__(self, env: dict[str, str]) -> None:
        self.tmux = need_tmux()
        self.socket = f"gl-screens-{uuid.uuid4().hex[:8]}"
        self.env = env
        # A session that stays: the server exits with its last session, and a session started
        # while it is exiting fails ("server exited unexpectedly").
        keep = self._tmux("new-session", "-d", "-s", "keep", "sleep", "86400")
        assert keep.returncode == 0, keep.stderr

    def _tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.tmux, "-L", self.socket, "-f", "/dev/null", *args], env=self.env,
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip

    def start(self, command: list[str], width: int, height: int) -> str:
        """A session running ``command`` then printing DONE (and staying, so it can be read)."""
        name = uuid.uuid4().hex[:8]
        script = f"{shlex.join(command)}; echo {DONE}; sleep 600"
        done = self._tmux("new-session", "-d", "-s", name, "-x", str(width), "-y", str(height), "bash", "-c", script)
        assert done.returncode == 0, done.stderr
        return name

    def lines(self, name: str, join_wrapped: bool = False) -> list[str]:
        """The screen and its scrollback; with ``join_wrapped`` a row the terminal wrapped is one."""
        args = ["capture-pane", "-p", "-t", name, "-S", "-5000"] + (["-J"] if join_wrapped else [])
        out = self._tmux(*args)
        assert out.returncode == 0, out.stderr
        text = out.stdout.splitlines()
        while text and not text[-1].strip():
            text.pop()
        return text

    def wait_for(self, name: str, ready: Callable[[list[str]], bool], timeout_s: float = 120) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            lines = self.lines(name)
            if ready(lines):
                return lines
            time.sleep(0.1)
        raise AssertionError("the terminal never showed what was awaited:\n" + "\n".join(self.lines(name)))

    def run(self, command: list[str], width: int, height: int) -> list[str]:
        """What ``command`` printed in a ``width`` x ``height`` terminal, after checking that the
        terminal wrapped no line (a line wider than the terminal is wrapped by it)."""
        name = self.start(command, width, height)
        try:
            screen = self.wait_for(name, lambda lines: any(line.strip() == DONE for line in lines))
            joined = self.lines(name, join_wrapped=True)
        finally:
            self.kill(name)
        assert screen == joined, "a line wrapped:\n" + "\n".join(screen)
        return screen[: screen.index(DONE)] if DONE in screen else screen[:-1]

    def send(self, name: str, *keys: str) -> None:
        self._tmux("send-keys", "-t", name, *keys)

    def kill(self, name: str) -> None:
        self._tmux("kill-session", "-t", name)

    def close(self) -> None:
        self._tmux("kill-server")
