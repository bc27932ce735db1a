"""The output relay: a small forked process between CMD's output and the user's terminal.

Why a separate process: if gpuledger itself sat in the data path, ``kill -9`` of gpuledger would
close the pipe and CMD would die of SIGPIPE on its next print. The relay is not in CMD's process
group and ignores terminal signals, so it outlives gpuledger, drains CMD's output to the terminal
untouched (colours, ``\\r`` progress bars) and writes the redacted copy to the run's log file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
from collections.abc import Callable

READ_CHUNK = 65536


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        view = view[n:]


def pump(
    sources: dict[int, int],
    log_fd: int,
    redact: Callable[[bytes], bytes],
    flush: Callable[[], bytes],
) -> None:
    """Copy each source fd to its destination fd and the redacted stream to ``log_fd`` until EOF.

    A destination that fails (terminal closed) is dropped; the log keeps going, and a failing
    log keeps the terminal going: neither may stop the other or CMD.
    """
    live = dict(sources)
    log_ok = True
    dest_ok = dict.fromkeys(set(live.values()), True)
    while live:
        try:
            ready, _, _ = select.select(list(live), [], [])
        except InterruptedError:
            continue
        for src in ready:
            try:
                data = os.read(src, READ_CHUNK)
            except OSError as exc:
                # EIO is how a pty master reports that every slave end is closed.
                if exc.errno not in (errno.EIO, errno.EBADF):
                    raise
                data = b""
            if not data:
                live.pop(src)
                continue
            dest = live[src]
            if dest_ok[dest]:
                try:
                    _write_all(dest, data)
                except OSError:
                    dest_ok[dest] = False
            if log_ok:
                try:
                    _write_all(log_fd, redact(data))
                except OSError as exc:
                    log_ok = False
                    _warn(f"gpuledger: cannot write the run log ({exc.strerror}); output still shown")
    if log_ok:
        with contextlib.suppress(OSError):
            _write_all(log_fd, flush())


def _warn(line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode())


def start_relay(sources: dict[int, int], log_path: str, close_in_child: list[int]) -> int:
    """Fork the relay; return its pid. ``sources`` maps a readable fd to the fd it is copied to."""
    from gpuledger.core.redact import LineRedactor, Redactor

    redactor = LineRedactor(Redactor.default())
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    pid = os.fork()
    if pid:
        os.close(log_fd)
        return pid
    # Child: survive the signals aimed at gpuledger and the terminal; exit at EOF only.
    code = 0
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP):
            signal.signal(sig, signal.SIG_IGN)
        for fd in close_in_child:
            with contextlib.suppress(OSError):
                os.close(fd)
        pump(sources, log_fd, redactor.feed, redactor.flush)
        with contextlib.suppress(OSError):
            os.fsync(log_fd)
    except BaseException as exc:
        _warn(f"gpuledger: output relay stopped: {exc!r}")
        code = 1
    finally:
        os._exit(code)  # never run the parent's atexit handlers or flush its buffers twice
