"""CMD on gpuledger's pty: its bytes reach the relay as written, without the kernel's output
processing (recorder/launch.py, ``pass_output_as_written``). gpuledger's own terminal then
processes them once, as it would without gpuledger, and the log keeps CMD's ``\\n``.

tests/test_relay_e2e.py checks the screen of a whole ``gpuledger run`` on a cooked terminal."""

from __future__ import annotations

import os
import sys
import termios
from pathlib import Path

from gpuledger.recorder.launch import launch

# CMD says whether its stdout is a terminal and whether that terminal processes output, then
# prints lines ending in \n and a progress row redrawn with \r.
SHOW = (
    "import os, sys, termios\n"
    "post = termios.tcgetattr(1)[1] & termios.OPOST\n"
    "sys.stdout.write(f'tty={os.isatty(1)} opost={bool(post)}\\n')\n"
    "sys.stdout.write('a\\rb\\nc\\n')\n"
)


def _run_on_pty(tmp_path: Path) -> tuple[bytes, int]:
    log = tmp_path / "run.log"
    launched = launch([sys.executable, "-c", SHOW], dict(os.environ), str(log), use_pty=True)
    try:
        _, status = os.waitpid(launched.pid, 0)
        os.waitpid(launched.relay_pid, 0)  # the relay ends at the pty's EOF, once CMD is gone
    finally:
        assert launched.pty_master is not None
        os.close(launched.pty_master)
    return log.read_bytes(), status


def test_cmd_on_a_pty_writes_its_bytes_unprocessed(tmp_path: Path) -> None:
    data, status = _run_on_pty(tmp_path)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert data == b"tty=True opost=False\na\rb\nc\n"  # no \r added before each \n


def test_only_output_processing_is_changed(tmp_path: Path) -> None:
    """The pty stays a terminal with its other settings (echo, signals, canonical input) as opened."""
    import pty

    master, slave = pty.openpty()
    try:
        fresh = termios.tcgetattr(slave)
    finally:
        os.close(master)
        os.close(slave)
    from gpuledger.recorder.launch import pass_output_as_written

    master, slave = pty.openpty()
    try:
        pass_output_as_written(slave)
        after = termios.tcgetattr(slave)
    finally:
        os.close(master)
        os.close(slave)
    assert after[1] == fresh[1] & ~termios.OPOST
    assert [after[i] for i in (0, 2, 3)] == [fresh[i] for i in (0, 2, 3)]
