"""Start CMD in its own process group, with its output going through the relay."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import pty
import subprocess
import termios
from collections.abc import Mapping
from dataclasses import dataclass

from gpuledger.recorder.relay import start_relay

PR_SET_CHILD_SUBREAPER = 36


class LaunchError(Exception):
    """CMD could not be started; ``exit_code`` follows the shell's convention (126/127).
    ``reason``: the cause in a few words, for the failed run's status reason; None when the
    refusal came before any launch was tried (a bad setting), so there is no run to record."""

    def __init__(self, message: str, exit_code: int, reason: str | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.reason = reason


def launch_failure(program: str, exc: OSError) -> LaunchError:
    """The shell's verdict on an exec that failed: 127 when the program is not there, 126 when it
    is there but cannot be run (no permission, a directory, not a program the kernel can load)."""
    if exc.errno == errno.ENOENT:
        code, cause = 127, "not found"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        cause = "is a directory" if "/" in program and os.path.isdir(program) else "permission denied"
        code = 126
    elif exc.errno == errno.ENOEXEC:
        code, cause = 126, "not executable (not a program the system can run)"
    else:
        code, cause = 126, exc.strerror or str(exc)
    return LaunchError(f"cannot start {program!r}: {exc.strerror}", code, f"cannot start {program!r}: {cause}")


@dataclass
class Launched:
    pid: int  # CMD; also its process-group id
    relay_pid: int
    pty_master: int | None  # kept to pass terminal resizes on to CMD


def become_subreaper() -> bool:
    """Adopt CMD's orphaned descendants, so their CPU time is reaped (and counted) by us."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def copy_window_size(from_fd: int, to_fd: int) -> None:
    with contextlib.suppress(OSError):
        size = fcntl.ioctl(from_fd, termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(to_fd, termios.TIOCSWINSZ, size)


def pass_output_as_written(slave: int) -> None:
    """Turn off output processing (OPOST: ``\n`` to ``\r\n`` and the like) on CMD's pty.

    The relay copies CMD's bytes to gpuledger's own terminal, and that terminal processes them as
    it would CMD's own output: so the screen gets what it gets without gpuledger (not ``\r\r\n``
    from processing twice), the log keeps the bytes CMD wrote (``\n``, as on pipes), and CMD's
    writes skip the kernel's byte-by-byte output pass (about 0.05 s of CMD's CPU per 50 MB)."""
    with contextlib.suppress(OSError, termios.error):
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.OPOST
        termios.tcsetattr(slave, termios.TCSANOW, attrs)


def launch(argv: list[str], env: Mapping[str, str], log_path: str, use_pty: bool | None = None) -> Launched:
    """Fork the relay, then start CMD as a new session whose output the relay copies.

    With a terminal on stdout CMD gets a pty, so progress bars and colours look as they would
    without gpuledger; otherwise two pipes keep its stdout and stderr apart.
    """
    if use_pty is None:
        use_pty = os.isatty(1)
    if use_pty:
        master, slave = pty.openpty()
        copy_window_size(1, slave)
        pass_output_as_written(slave)
        sources, child_out, child_err, writers = {master: 1}, slave, slave, [slave]
    else:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        master = None
        sources, child_out, child_err, writers = {out_r: 1, err_r: 2}, out_w, err_w, [out_w, err_w]
    relay_pid = start_relay(sources, log_path, close_in_child=writers)
    failure: OSError | None = None
    try:
        proc = subprocess.Popen(
            argv,
            stdout=child_out,
            stderr=child_err,
            env=dict(env),
            start_new_session=True,  # own process group: gpuledger's signals are forwarded, not shared
            close_fds=True,
        )
    except OSError as exc:
        failure = exc
    finally:
        # The relay sees EOF only once every writer is closed; ours must go now.
        for fd in writers:
            os.close(fd)
        for fd in sources:
            if fd != master:
                os.close(fd)
    if failure is not None:
        _discard_relay(relay_pid, master, log_path)
        raise launch_failure(argv[0], failure) from failure
    # We reap CMD ourselves with wait4 (to get its rusage); Popen must not race us for it.
    proc.returncode = 0
    return Launched(pid=proc.pid, relay_pid=relay_pid, pty_master=master)


def _discard_relay(relay_pid: int, master: int | None, log_path: str) -> None:
    """CMD never started: let the relay reach EOF and end, and remove the log it opened (empty: the
    failed run is recorded with its empty log in the ledger, so the file would be an orphan)."""
    if master is not None:
        with contextlib.suppress(OSError):
            os.close(master)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(relay_pid, 0)
    with contextlib.suppress(OSError):
        if os.path.getsize(log_path) == 0:
            os.unlink(log_path)
