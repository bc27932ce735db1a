"""Per-process readers for the host collector: one process's counters, and the processes below a root.

``make_reader(backend)`` picks one of two readers with the same interface: ``sample(pid, io=True)``
(ppid, start time, ``Usage``, rss, threads; raises ``Gone`` or ``Unreadable``; ``io=False`` skips
the I/O counters), ``scan(root, root_start)``
(the root's descendants, parents first), ``scan_born(since, upto)``, ``last_pid()``, ``forget(pid)``
and ``close()``. What the figures mean and how they add up is host.py's business.

ProcfsReader (Linux; ``backend="auto"`` or ``"procfs"``)
    A narrow /proc fast path: one stat and one io file per process, through kept-open files re-read
    with pread (``OpenFiles``). In the real 1 s loop on a 2-core VM: 8 processes ~0.3 ms, against
    ~1.4 ms with psutil ``oneshot()`` (benchmarks/host_tick.py measures it). A kept
    /proc/<pid>/ file answers ESRCH once the process is reaped, so a reused pid is noticed.
    ``last_pid`` reads /proc/loadavg (the last pid the kernel handed out), and ``scan_born`` reads
    only the processes born since a given pid, which lets the collector skip or shorten its scans.
PsutilReader (portable; ``backend="psutil"``, or "auto" where /proc cannot be read)
    psutil ``oneshot()`` per process, ``children(recursive=True)`` to scan. It cannot tell whether a
    pid was handed out (``last_pid`` is None: every due scan is a whole one), nor that a pid was
    reused between two reads.
"""

from __future__ import annotations

import contextlib
import os
import resource
import weakref
from collections.abc import Callable
from typing import NamedTuple

import psutil


class Usage(NamedTuple):
    """Cumulative counters: of one process (own + reaped children) or of the whole tree."""

    cpu_s: float = 0.0
    read_b: int = 0
    write_b: int = 0


class _Sample(NamedTuple):
    ppid: int
    start: float  # with the pid, identifies the process (pid reuse)
    usage: Usage  # read_b/write_b are 0 when /proc/<pid>/io cannot be read
    rss_b: int
    threads: int


def _own_cpu_s() -> float:
    """This process's CPU seconds, its reaped children's included, in microseconds from the kernel:
    /proc/<pid>/stat counts the same in whole clock ticks, each rounded down (up to two ticks, 20 ms
    at 100 Hz, short), and gpuledger.track() meters the very process it runs in."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class Gone(Exception):
    """The process no longer exists: it has been reaped."""


class Unreadable(Exception):
    """The process exists but cannot be read now (permission, zombie on some systems)."""


Scan = list[tuple[int, int, float]]  # (pid, ppid, start) of the root's descendants, parents first


def _bfs(root: int, kids: dict[int, list[tuple[int, float]]]) -> Scan:
    out: Scan = []
    seen = {root}
    queue = [root]
    for parent in queue:  # the list grows while we walk it: breadth first, parents before children
        for pid, start in kids.get(parent, ()):
            if pid not in seen:
                seen.add(pid)
                out.append((pid, parent, start))
                queue.append(pid)
    return out


def _pread_all(fd: int) -> bytes:
    chunks = [os.pread(fd, 16384, 0)]
    while len(chunks[-1]) == 16384:  # a big file (diskstats of a large server): read on
        chunks.append(os.pread(fd, 16384, 16384 * len(chunks)))
    return b"".join(chunks)


def _cat(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return _pread_all(fd)
    finally:
        os.close(fd)


def _stat_fields(data: bytes) -> list[bytes]:
    # After the name (which may hold spaces and parentheses); up to rss, the last field we use.
    return data[data.rfind(b")") + 2 :].split(None, 22)


def _all_processes(wanted: Callable[[int], bool]) -> Scan:
    """(pid, ppid, start) of the wanted processes; listdir shows processes only, not threads."""
    out: Scan = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if name.isdigit() and wanted(int(name)):
            try:
                f = _stat_fields(_cat(f"/proc/{name}/stat"))  # not kept open: most are not ours
                out.append((int(name), int(f[1]), int(f[19])))
            except (OSError, ValueError, IndexError):
                continue  # ended meanwhile
    return out


def _close_fds(fds: dict[str, int]) -> None:
    for fd in fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


class OpenFiles:
    """/proc files kept open and re-read with pread at offset 0, which makes the kernel render them
    afresh: half the CPU of open+read+close in the real loop (measured). A kept /proc/<pid>/ file
    answers ESRCH once that process is reaped, even if its pid is reused meanwhile."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        # Never crowd the metered process's own descriptors (track() runs inside the training).
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self._limit = 128 if soft == resource.RLIM_INFINITY else min(128, soft // 8)
        # A collector dropped without close() (a notebook's track(), a caller's mistake) must not
        # leave its descriptors open for the life of the training process.
        weakref.finalize(self, _close_fds, self._fds)

    def read(self, path: str) -> bytes:
        fd = self._fds.get(path)
        if fd is None:
            if len(self._fds) >= self._limit:
                return _cat(path)
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
        try:
            return _pread_all(fd)
        except OSError:
            self.close(path)
            raise

    def close(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def close_all(self) -> None:
        for path in list(self._fds):
            self.close(path)


class ProcfsReader:
    """Linux fast path: /proc/<pid>/stat (cpu, ppid, threads, rss, start) and /proc/<pid>/io."""

    name = "procfs"

    def __init__(self) -> None:
        self._tck = os.sysconf("SC_CLK_TCK")
        self._page_b = os.sysconf("SC_PAGE_SIZE")
        self._files = OpenFiles()

    def sample(self, pid: int, io: bool = True) -> _Sample:
        """``io=False``: the I/O counters are not read (0 in ``usage``; the caller keeps its last figure)."""
        try:
            f = _stat_fields(self._files.read(f"/proc/{pid}/stat"))
            # man 5 proc numbering minus 3: ppid 4, utime 14 .. cstime 17, threads 20, start 22, rss 24
            if pid == os.getpid():
                cpu_s = _own_cpu_s()
            else:
                cpu_s = (int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])) / self._tck
            ppid, start, rss_b, threads = int(f[1]), int(f[19]), int(f[21]) * self._page_b, int(f[17])
        except (FileNotFoundError, ProcessLookupError):
            raise Gone from None
        except (OSError, ValueError, IndexError):
            raise Unreadable from None
        read_b, write_b = self._io(pid) if io else (0, 0)
        return _Sample(ppid, start, Usage(cpu_s, read_b, write_b), rss_b, threads)

    def _io(self, pid: int) -> tuple[int, int]:
        try:
            data = self._files.read(f"/proc/{pid}/io")  # needs ptrace-read rights: not another user's
        except OSError:
            return 0, 0
        f = data.split()  # rchar: N wchar: N syscr: N syscw: N read_bytes: N write_bytes: N ...
        if len(f) < 12 or f[8] != b"read_bytes:" or f[10] != b"write_bytes:" or not f[9].isdigit():
            return 0, 0  # not the layout we know: absent rather than misread
        return int(f[9]), int(f[11])

    def scan(self, root: int, root_start: float) -> Scan:
        kids: dict[int, list[tuple[int, float]]] = {}
        for pid, ppid, start in _all_processes(lambda pid: True):
            if pid == root and start != root_start:
                return []  # the root ended and its pid was reused
            kids.setdefault(ppid, []).append((pid, start))
        return _bfs(root, kids)

    @staticmethod
    def scan_born(since: int, upto: int) -> Scan:
        """(pid, ppid, start) of the processes whose pid was handed out in (since, upto], in the
        kernel's (cyclic) order, so parents come before their children."""
        if since == upto:
            return []
        if upto < since:  # the pid counter wrapped around pid_max
            out = _all_processes(lambda pid: pid > since or pid <= upto)
        else:
            out = _all_processes(lambda pid: since < pid <= upto)
        out.sort(key=lambda t: (t[0] <= since, t[0]))
        return out

    def last_pid(self) -> int | None:
        """The last pid the kernel handed out (threads included): unchanged means nothing was born."""
        try:
            return int(self._files.read("/proc/loadavg").split()[4])
        except (OSError, ValueError, IndexError):
            return None

    def forget(self, pid: int) -> None:
        self._files.close(f"/proc/{pid}/stat")
        self._files.close(f"/proc/{pid}/io")

    def close(self) -> None:
        self._files.close_all()


class PsutilReader:
    """Portable reader: psutil ``oneshot()`` per process, ``children(recursive=True)`` to scan."""

    name = "psutil"

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}  # keeps psutil's per-process caches warm

    def sample(self, pid: int, io: bool = True) -> _Sample:
        try:
            proc = self._procs.get(pid) or self._procs.setdefault(pid, psutil.Process(pid))
            with proc.oneshot():
                if pid == os.getpid():
                    cpu_s = _own_cpu_s()
                else:
                    t = proc.cpu_times()
                    cpu_s = t.user + t.system + t.children_user + t.children_system
                read_b, write_b = self._io(proc) if io else (0, 0)
                return _Sample(
                    proc.ppid(), proc.create_time(), Usage(cpu_s, read_b, write_b),
                    proc.memory_info().rss, proc.num_threads(),
                )  # fmt: skip
        except psutil.ZombieProcess:  # a subclass of NoSuchProcess: check first
            raise Unreadable from None
        except psutil.NoSuchProcess:
            self.forget(pid)
            raise Gone from None
        except psutil.AccessDenied:
            raise Unreadable from None

    @staticmethod
    def _io(proc: psutil.Process) -> tuple[int, int]:
        try:
            io = proc.io_counters()  # absent on macOS
        except (AttributeError, psutil.AccessDenied):
            return 0, 0
        return io.read_bytes, io.write_bytes

    def scan(self, root: int, root_start: float) -> Scan:
        try:
            top = psutil.Process(root)
            if top.create_time() != root_start:
                return []
            found = top.children(recursive=True)
        except psutil.Error:
            return []
        kids: dict[int, list[tuple[int, float]]] = {}
        for proc in found:
            try:
                kids.setdefault(proc.ppid(), []).append((proc.pid, proc.create_time()))
            except psutil.Error:
                continue
        return _bfs(root, kids)

    @staticmethod
    def last_pid() -> int | None:
        return None  # no portable way to know: always a whole scan when due

    def scan_born(self, since: int, upto: int) -> Scan:
        """Nothing to add: without last_pid() the collector always makes whole scans instead."""
        return []

    def forget(self, pid: int) -> None:
        self._procs.pop(pid, None)

    def close(self) -> None:
        self._procs.clear()


_Reader = ProcfsReader | PsutilReader


def make_reader(backend: str) -> _Reader:
    if backend == "psutil":
        return PsutilReader()
    if backend not in ("auto", "procfs"):
        raise ValueError(f"unknown host collector backend {backend!r}: use 'auto', 'procfs' or 'psutil'")
    reader = ProcfsReader()
    try:
        reader.sample(os.getpid())
    except Exception:
        if backend == "procfs":
            raise
        return PsutilReader()
    finally:
        reader.forget(os.getpid())
    return reader
