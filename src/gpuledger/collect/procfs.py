"""Per-process readers for the host collector: one process's counters, and the processes below a root.

``make_reader(backend)`` picks one of two readers with the same interface: ``sample(pid, io=True)``
(ppid, start time, ``Usage``, rss, threads; raises ``Gone`` or ``Unreadable``; ``io=False`` skips
the I/O counters), the same in two parts for the every-tick path, ``stat(pid)`` (a plain tuple)
and ``io(pid)``, ``scan(root, root_start)``
(the root's descendants, parents first), ``scan_born(since, upto)``, ``last_pid()``, ``forget(pid)``
and ``close()``. What the figures mean and how they add up is host.py's business.

ProcfsReader (Linux; ``backend="auto"`` or ``"procfs"``)
    A narrow /proc fast path: one stat and one io file per process, kept open per pid and re-read
    with pread (a dict look-up and one syscall per file, no path built per read). In the real 1 s
    loop on a shared 2-core VM, 8 processes as ``gpuledger run`` reads them: 0.16 ms a plain tick,
    0.23 ms on average with the interval's counters and scans, against 0.94 and 1.36 ms with psutil
    ``oneshot()`` (benchmarks/host_tick.py, 2026-12-05). A kept /proc/<pid>/ file answers ESRCH once
    the process is reaped, so a reused pid is noticed.
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
from collections.abc import Callable, Iterable
from typing import NamedTuple

import psutil


class Usage(NamedTuple):
    """Cumulative counters: of one process (own + reaped children) or of the whole tree."""

    cpu_s: float = 0.0
    read_b: int = 0
    write_b: int = 0


_Stat = tuple[int, float, float, int, int]  # ppid, start, cpu_s, rss_b, threads


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


_STAT_READ = 2048  # /proc/<pid>/stat: ~300 bytes, at most ~1.2 KiB (52 numbers and the name)
_IO_READ = 512  # /proc/<pid>/io: seven "name: number" lines

# getpid is a system call (glibc >= 2.25), and sample() asks at every read: known once per process.
_own_pid = [os.getpid()]
if hasattr(os, "register_at_fork"):  # not on Windows, where the /proc reader is not used either
    os.register_at_fork(after_in_child=lambda: _own_pid.__setitem__(0, os.getpid()))


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


def _cat(path: str, size: int = 16384) -> bytes:
    """The whole file; ``size``: what the first read asks for (a stat file: not a 16 KiB buffer)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.pread(fd, size, 0)
        return _pread_all(fd) if len(data) >= size else data
    finally:
        os.close(fd)


def _stat_fields(data: bytes) -> list[bytes]:
    # After the name (which may hold spaces and parentheses); up to rss, the last field we use.
    return data[data.rfind(b")") + 2 :].split(None, 22)


def _list_proc() -> list[str]:
    """The names in /proc: processes only, not threads (and a few files)."""
    try:
        return os.listdir("/proc")
    except OSError:
        return []


def _all_processes(names: list[str], wanted: Callable[[int], bool]) -> Scan:
    """(pid, ppid, start) of the wanted processes among ``names`` (a listing of /proc)."""
    return _read_parents(name for name in names if name.isdigit() and wanted(int(name)))


def _listed_born(names: list[str], since: int, upto: int) -> Scan:
    """(pid, ppid, start) of the listed processes whose pid lies in (since, upto], cyclic over pid_max.
    A short window is matched as a set of names against the listing, in C, not parsed name by name."""
    if since < upto <= since + 4096:
        return _read_parents(set(map(str, range(since + 1, upto + 1))).intersection(names))
    inside = (lambda pid: since < pid <= upto) if upto > since else (lambda pid: pid > since or pid <= upto)
    return _all_processes(names, inside)


def _read_parents(names: Iterable[str]) -> Scan:
    out: Scan = []
    for name in names:
        try:
            f = _stat_fields(_cat(f"/proc/{name}/stat", _STAT_READ))  # not kept open: most are not ours
            out.append((int(name), int(f[1]), int(f[19])))
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
    return out


def _probe_born(since: int, upto: int) -> Scan:
    """(pid, ppid, start) of the processes with a pid in (since, upto], found by opening each pid's
    stat: cheaper than listing /proc when few pids were handed out. /proc/<tid> of a thread opens
    too (unlisted): a thread is the one task whose exit signal is -1, and is left out."""
    out: Scan = []
    for pid in range(since + 1, upto + 1):
        try:
            data = _cat(f"/proc/{pid}/stat", _STAT_READ)
            f = data[data.rfind(b")") + 2 :].split(None, 36)
            if f[35] != b"-1":  # man 5 proc field 38, exit_signal
                out.append((pid, int(f[1]), int(f[19])))
        except (OSError, ValueError, IndexError):
            continue  # never handed to a process, ended meanwhile, or not readable
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


def _fd_limit() -> int:
    # Never crowd the metered process's own descriptors (track() runs inside the training).
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 128 if soft == resource.RLIM_INFINITY else min(128, soft // 8)


def _close_pid_fds(*tables: dict[int, int]) -> None:
    for table in tables:
        for fd in table.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        table.clear()


class ProcfsReader:
    """Linux fast path: /proc/<pid>/stat (cpu, ppid, threads, rss, start) and /proc/<pid>/io.

    The per-process files stay open, keyed by pid (``forget`` closes them): a read is one dict
    look-up and one pread of a bounded size, which is the whole cost that repeats every tick.
    """

    name = "procfs"

    def __init__(self) -> None:
        self._tck = os.sysconf("SC_CLK_TCK")
        self._page_b = os.sysconf("SC_PAGE_SIZE")
        self._files = OpenFiles()  # /proc/loadavg
        self._stat_fds: dict[int, int] = {}
        self._io_fds: dict[int, int] = {}
        self._limit = _fd_limit()  # for both tables together
        self._listed = 0  # entries in the latest listing of /proc: what a listing costs (scan_born)
        # A collector dropped without close() must not leave its descriptors open (see OpenFiles).
        weakref.finalize(self, _close_pid_fds, self._stat_fds, self._io_fds)

    def sample(self, pid: int, io: bool = True) -> _Sample:
        """``io=False``: the I/O counters are not read (0 in ``usage``; the caller keeps its last figure)."""
        ppid, start, cpu_s, rss_b, threads = self.stat(pid)
        read_b, write_b = self.io(pid) if io else (0, 0)
        return _Sample(ppid, start, Usage(cpu_s, read_b, write_b), rss_b, threads)

    def stat(self, pid: int) -> _Stat:
        """(ppid, start, cpu_s, rss_b, threads) from /proc/<pid>/stat: what every tick reads, as a
        plain tuple (a named one costs a Python-level call to build)."""
        fd = self._stat_fds.get(pid)
        try:
            data = os.pread(fd, _STAT_READ, 0) if fd is not None else self._first(pid, "stat", self._stat_fds)
            if len(data) >= _STAT_READ and fd is not None:  # longer than any seen: read it whole
                data = _pread_all(fd)
            # After the name (which may hold spaces and parentheses); up to rss, the last field used.
            f = data[data.rfind(b")") + 2 :].split(None, 22)
            # man 5 proc numbering minus 3: ppid 4, utime 14 .. cstime 17, threads 20, start 22, rss 24
            if pid == _own_pid[0]:
                cpu_s = _own_cpu_s()
            else:
                cpu_s = (int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])) / self._tck
            return int(f[1]), int(f[19]), cpu_s, int(f[21]) * self._page_b, int(f[17])
        except (FileNotFoundError, ProcessLookupError):
            self.forget(pid)
            raise Gone from None
        except OSError:
            self.forget(pid)  # opened afresh next time (a kept file that went bad)
            raise Unreadable from None
        except (ValueError, IndexError):
            raise Unreadable from None

    def _first(self, pid: int, name: str, table: dict[int, int]) -> bytes:
        """The first read of /proc/<pid>/<name>: the file is kept open for the next ones, unless
        that would take more than our share of descriptors (then it is read and closed)."""
        path = f"/proc/{pid}/{name}"
        if len(self._stat_fds) + len(self._io_fds) >= self._limit:
            return _cat(path)
        fd = table[pid] = os.open(path, os.O_RDONLY)
        return _pread_all(fd)

    def io(self, pid: int) -> tuple[int, int]:
        """(read_bytes, write_bytes) of /proc/<pid>/io; (0, 0) when it cannot be read."""
        fd = self._io_fds.get(pid)
        try:  # needs ptrace-read rights: not another user's process
            data = os.pread(fd, _IO_READ, 0) if fd is not None else self._first(pid, "io", self._io_fds)
        except OSError:
            fd = self._io_fds.pop(pid, None)
            if fd is not None:
                os.close(fd)
            return 0, 0
        f = data.split()  # rchar: N wchar: N syscr: N syscw: N read_bytes: N write_bytes: N ...
        if len(f) < 12 or f[8] != b"read_bytes:" or f[10] != b"write_bytes:" or not f[9].isdigit():
            return 0, 0  # not the layout we know: absent rather than misread
        return int(f[9]), int(f[11])

    def scan(self, root: int, root_start: float) -> Scan:
        kids: dict[int, list[tuple[int, float]]] = {}
        names = _list_proc()
        self._listed = len(names)
        for pid, ppid, start in _all_processes(names, lambda pid: True):
            if pid == root and start != root_start:
                return []  # the root ended and its pid was reused
            kids.setdefault(ppid, []).append((pid, start))
        return _bfs(root, kids)

    def scan_born(self, since: int, upto: int) -> Scan:
        """(pid, ppid, start) of the processes whose pid was handed out in (since, upto], in the
        kernel's (cyclic) order, so parents come before their children.

        A listing of /proc costs in proportion to the processes on the machine (the kernel builds
        an entry for each), a probe in proportion to the pids handed out (threads take pids too),
        each about three times a listed entry (measured on a 2-core VM): a window under a quarter
        of the processes last listed is probed pid by pid, a longer one read from a listing."""
        if since == upto:
            return []
        if since < upto and upto - since <= self._listed // 4:
            return _probe_born(since, upto)  # in pid order already
        names = _list_proc()
        self._listed = len(names)
        out = _listed_born(names, since, upto)
        out.sort(key=lambda t: (t[0] <= since, t[0]))
        return out

    def last_pid(self) -> int | None:
        """The last pid the kernel handed out (threads included): unchanged means nothing was born."""
        try:
            return int(self._files.read("/proc/loadavg").split()[4])
        except (OSError, ValueError, IndexError):
            return None

    def forget(self, pid: int) -> None:
        for table in (self._stat_fds, self._io_fds):
            fd = table.pop(pid, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def close(self) -> None:
        self._files.close_all()
        _close_pid_fds(self._stat_fds, self._io_fds)


class PsutilReader:
    """Portable reader: psutil ``oneshot()`` per process, ``children(recursive=True)`` to scan."""

    name = "psutil"

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}  # keeps psutil's per-process caches warm

    def sample(self, pid: int, io: bool = True) -> _Sample:
        ppid, start, cpu_s, rss_b, threads = self.stat(pid)
        read_b, write_b = self.io(pid) if io else (0, 0)
        return _Sample(ppid, start, Usage(cpu_s, read_b, write_b), rss_b, threads)

    def stat(self, pid: int) -> _Stat:
        try:
            proc = self._procs.get(pid) or self._procs.setdefault(pid, psutil.Process(pid))
            with proc.oneshot():
                if pid == os.getpid():
                    cpu_s = _own_cpu_s()
                else:
                    t = proc.cpu_times()
                    cpu_s = t.user + t.system + t.children_user + t.children_system
                return proc.ppid(), proc.create_time(), cpu_s, proc.memory_info().rss, proc.num_threads()
        except psutil.ZombieProcess:  # a subclass of NoSuchProcess: check first
            raise Unreadable from None
        except psutil.NoSuchProcess:
            self.forget(pid)
            raise Gone from None
        except psutil.AccessDenied:
            raise Unreadable from None

    def io(self, pid: int) -> tuple[int, int]:
        proc = self._procs.get(pid)
        try:
            counters = (proc or psutil.Process(pid)).io_counters()  # absent on macOS
        except (AttributeError, psutil.Error):
            return 0, 0
        return counters.read_bytes, counters.write_bytes

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
