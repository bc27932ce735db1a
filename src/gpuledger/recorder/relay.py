"""The output relay: a small forked process between CMD's output and the user's terminal.

Why a separate process: if gpuledger itself sat in the data path, ``kill -9`` of gpuledger would
close the pipe and CMD would die of SIGPIPE on its next print. The relay is not in CMD's process
group and ignores terminal signals, so it outlives gpuledger, drains CMD's output to the terminal
untouched (colours, ``\\r`` progress bars) and writes the redacted copy to the run's log file.

Speed (a chatty training prints tens of MB): each wake-up reads a source until it is empty (a pty
gives about 4 KiB a read, a pipe its capacity, raised to 1 MiB) into one reused buffer and writes
it to the terminal in one piece, unchanged. The log copy is redacted in batches of about 128 KiB
(large enough that the redaction's per-call cost is paid rarely, small enough to stay in the CPU's
cache); a batch is written as soon as CMD pauses (20 ms without output), is 0.2 s old or is full,
so the file on disk is never far behind the terminal. If the relay itself is killed, at most that
batch is missing from the file. Each source (stdout and stderr on pipes) is redacted as its own
stream, so the log holds whole lines of each, and the other stream never cuts a secret in two.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import os
import select
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpuledger.core.training.lineindex import LineIndexer

DRAIN_LIMIT_B = 1 << 20  # read one source at most this much before serving the others
PIPE_SIZE_B = 1 << 20  # asked of the kernel for pipe sources (the unprivileged maximum by default)
LOG_BATCH_B = 128 << 10  # redact and append the log copy once this much is waiting (fits a CPU cache) ...
LOG_QUIET_S = 0.02  # ... or CMD has been silent this long ...
LOG_MAX_AGE_S = 0.2  # ... or the oldest waiting byte is this old
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux; fcntl names it from Python 3.10 on


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        except BlockingIOError:  # a terminal someone set non-blocking: wait until it takes more
            waiter = select.poll()
            waiter.register(fd, select.POLLOUT)
            waiter.poll()
            continue
        view = view[n:]


def _prepare_source(fd: int) -> None:
    """Non-blocking, so a source is read until empty; a pipe asks for a larger buffer (fewer
    wake-ups for the relay, fewer stalls for CMD). A pty or a refused size is fine as it is."""
    os.set_blocking(fd, False)
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_SIZE_B)


class _Reader:
    """Reads a source until it is empty into one reused buffer: a pty hands out about 4 KiB per
    read, and a fresh 1 MiB bytes object per read would cost more than the read itself."""

    def __init__(self) -> None:
        self._buffer = bytearray(DRAIN_LIMIT_B)
        self._view = memoryview(self._buffer)

    def drain(self, fd: int) -> tuple[bytes, bool]:
        """What ``fd`` holds now (up to DRAIN_LIMIT_B) and whether it reached its end."""
        size = 0
        ended = False
        while size < DRAIN_LIMIT_B:
            try:
                n = os.readv(fd, [self._view[size:]])
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                # EIO is how a pty master reports that every slave end is closed.
                if exc.errno not in (errno.EIO, errno.EBADF):
                    raise
                n = 0
            if n == 0:
                ended = True
                break
            size += n
        return bytes(self._view[:size]), ended


class Stream(Protocol):
    """One source's redaction (core/redaction/redact.LineRedactor): complete lines out, the rest held."""

    def feed(self, data: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


class _LogCopy:
    """The redacted copy: bytes wait here until a batch is due, then are redacted and appended.
    Each source has its own stream, so a line of stderr never lands inside a line of stdout (and
    never splits a secret there). A failing log is reported once and dropped; the terminal copy
    goes on."""

    def __init__(self, fd: int, streams: dict[int, Stream], indexer: LineIndexer | None = None) -> None:
        self._fd = fd
        self._streams = streams
        self.indexer = indexer  # sees each byte as written to the file, in order
        self._waiting: list[tuple[int, bytes]] = []
        self._size = 0
        self._since = 0.0
        self.ok = True

    def add(self, src: int, data: bytes) -> None:
        if not self.ok:
            return
        if not self._waiting:
            self._since = time.monotonic()
        self._waiting.append((src, data))
        self._size += len(data)
        if self._size >= LOG_BATCH_B:
            self.write()

    def timeout(self) -> float | None:
        """How long the relay may wait for more output before this batch is due; None: no batch."""
        if not self._waiting:
            return None
        return max(0.0, min(LOG_QUIET_S, self._since + LOG_MAX_AGE_S - time.monotonic()))

    def due(self) -> bool:
        return bool(self._waiting) and time.monotonic() - self._since >= LOG_MAX_AGE_S

    def write(self) -> None:
        waiting, self._waiting, self._size = self._waiting, [], 0
        out: list[bytes] = []
        for src, group in itertools.groupby(waiting, key=lambda item: item[0]):
            pieces = [data for _, data in group]
            batch = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            feed = self._streams[src].feed
            # One drain can bring 1 MiB: redact it in cache-sized pieces.
            out.extend(feed(batch[i : i + LOG_BATCH_B]) for i in range(0, len(batch), LOG_BATCH_B))
        self._append(b"".join(out))

    def close(self) -> None:
        self.write()
        self._append(b"".join(stream.flush() for stream in self._streams.values()))

    def _append(self, data: bytes) -> None:
        if not self.ok or not data:
            return
        try:
            _write_all(self._fd, data)
        except OSError as exc:
            self.ok = False
            self._waiting, self._size = [], 0
            _warn(f"gpuledger: cannot write the run log ({exc.strerror}); output still shown")
            return
        if self.indexer is not None:
            self.indexer.feed(data)  # while the bytes are in the CPU's cache


def pump(
    sources: dict[int, int],
    log_fd: int,
    new_stream: Callable[[], Stream],
    index_path: str | None = None,
    index_max_b: int | None = None,
) -> None:
    """Copy each source fd to its destination fd, and each source's redacted stream (one
    ``new_stream()`` per source) to ``log_fd``, until every source ends. With ``index_path``, the
    lines the end-of-run reader wants are found in the same pass and saved there
    (core/training/lineindex.py), when the whole log was written and is at most ``index_max_b``
    (the log cap: a longer log is stored capped, and its index would only take memory).

    A destination that fails (terminal closed) is dropped; the log keeps going, and a failing
    log keeps the terminal going: neither may stop the other or CMD.
    """
    live = dict(sources)
    for fd in live:
        _prepare_source(fd)
    indexer = None
    if index_path is not None:
        from gpuledger.core.training.lineindex import LineIndexer

        indexer = LineIndexer(max_b=index_max_b)
    log = _LogCopy(log_fd, {fd: new_stream() for fd in live}, indexer)
    reader = _Reader()
    dest_ok = dict.fromkeys(set(live.values()), True)
    # poll, not select: select cannot watch a descriptor numbered 1024 or more, and the relay
    # inherits the numbering of whatever process started the run (a server, a test session).
    poller = select.poll()
    for fd in live:
        poller.register(fd, select.POLLIN | select.POLLPRI)  # hang-ups and errors always wake it
    try:
        while live:
            timeout = log.timeout()
            try:
                ready = [fd for fd, _ in poller.poll(None if timeout is None else timeout * 1000)]
            except InterruptedError:
                continue
            if not ready:  # CMD paused: bring the file up to date
                log.write()
                continue
            for src in ready:
                data, ended = reader.drain(src)
                if ended:
                    live.pop(src)
                    poller.unregister(src)
                if not data:
                    continue
                dest = sources[src]
                if dest_ok[dest]:
                    try:
                        _write_all(dest, data)
                    except OSError:
                        dest_ok[dest] = False
                log.add(src, data)
            if log.due():
                log.write()
    finally:
        log.close()
    # A log that failed holds what the index saw, or more: gpuledger run then finds the sizes differ.
    if index_path is not None and log.indexer is not None:
        _save_index(log.indexer, index_path)


def _save_index(indexer: LineIndexer, path: str) -> None:
    from gpuledger.core.training.lineindex import save

    index = indexer.close()
    if index is not None:
        with contextlib.suppress(OSError):  # none: the end-of-run reader scans the log itself
            save(index, path)


def _warn(line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode())


def start_relay(sources: dict[int, int], log_path: str, close_in_child: list[int]) -> int:
    """Fork the relay; return its pid. ``sources`` maps a readable fd to the fd it is copied to.
    The relay leaves the log's line index at ``lineindex.index_path(log_path)``."""
    from gpuledger.core.redaction.redact import Redactor
    from gpuledger.core.training.lineindex import index_path
    from gpuledger.runs.logfile import cap_or_default

    redactor = Redactor.default()
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
        pump(sources, log_fd, redactor.stream, index_path(log_path), cap_or_default(os.environ))
        with contextlib.suppress(OSError):
            os.fsync(log_fd)
    except BaseException as exc:
        _warn(f"gpuledger: output relay stopped: {exc!r}")
        code = 1
    finally:
        os._exit(code)  # never run the parent's atexit handlers or flush its buffers twice
