"""Host collector: CPU, memory and storage I/O of a run's process tree, plus host-wide counters.

The tree
    Every process below ``root_pid`` (and ``root_pid`` itself when ``include_root``), except
    ``exclude_pids`` and everything below them. Membership is sticky: a process seen once stays the
    run's until it ends, even after it is re-parented out of the tree (an orphan adopted by init).
    ``gpuledger run``: root = gpuledger with ``include_root=False`` (a subreaper, so CMD's orphans
    come back below the root), the output relay excluded. ``gpuledger.track()``: root = the current
    process with ``include_root=True``, so its own sampler thread's CPU (and the recorder's own
    ledger writes) are part of the run: small, and cheaper than subtracting them.

Counters (DESIGN §2.2)
    For a live process we read ``total = own + reaped``: utime+stime plus cutime+cstime (the
    children it has waited for), and /proc/<pid>/io read_bytes/write_bytes, which the kernel also
    folds into a parent when it reaps a child. The tree total is

        credits + Σ over tracked and kept processes of (highest total seen − base)

    reported through a running maximum, so it never decreases between reads. ``base`` is what
    predates metering: with ``include_root`` (track(): the current process has a history that is
    not the run's) processes present at the first read count from that read on; otherwise (run:
    the tree is the run's own children) every process counts from its birth.

When a tracked process is gone (reaped)
    * if its parent as last seen (walking up through processes gone in the same read) is tracked
      and alive, that parent reaped it: the final total is in the parent's counters, so its own
      figure is dropped (keeping both would count it twice). Children are read before parents, so
      a child found gone is normally inside its parent's counters of the same read; if not yet,
      the running maximum holds the total until it is.
    * otherwise it was reaped outside the tree (by the un-tracked root: gpuledger as subreaper; by
      init or another subreaper), and its last figure is kept.
    ``credit_reaped(pid, ...)`` hands over the exact figure from the reaper's wait4, which covers
    ``pid`` and every descendant reaped inside its subtree; it replaces what was counted for
    ``pid`` and for its tracked descendants that ended along a chain of ended processes. Live
    descendants were orphaned and are credited on their own; a descendant wrongly assumed inside
    (orphaned, then credited later) makes a dip that its own credit fills.
    Known gaps: CPU and I/O between the last read and the end of a process reaped outside the tree
    and never credited (only without a subreaper); children of a parent that ignores SIGCHLD (the
    kernel folds nothing into it: lost); a process born and orphaned to init between two scans;
    shared pages count once per process in ``rss_b``; writes later cancelled by a truncate count;
    with the psutil reader, a pid reused between two reads (the /proc reader notices).
    A credit lands in the tick of the next ``read``: read once more after the last credit.

Cost (DESIGN §7; benchmarks/host_tick.py measures it in the real loop)
    On Linux a narrow /proc fast path reads one stat and one io file per process plus /proc/stat,
    meminfo, diskstats and net/dev, through kept-open files re-read with pread. In the real 1 s
    loop on a 2-core VM: 8 processes ~0.3 ms and host counters ~0.2 ms, against ~1.4 ms and ~1-2 ms
    with psutil ``oneshot()`` and its host functions, which stay as the portable reader
    (``backend="psutil"``). The tree is scanned every ``rescan_every`` reads and after a tracked
    process ended, only if the kernel handed out a pid since the last scan (/proc/loadavg), and
    then reads only the processes born since (a whole scan every ``_FULL_SCAN_EVERY`` scans).
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import chain
from typing import Any, NamedTuple

import psutil

from gpuledger.core.model import HostTick

_SECTOR_B = 512  # /proc/diskstats counts 512-byte sectors whatever the device's block size
_MAX_GONE = 4096  # kept figures of ended processes awaiting a credit; beyond this the oldest are folded
_FULL_SCAN_EVERY = 12  # in between, a scan reads only the processes born since the previous one


class Usage(NamedTuple):
    """Cumulative counters: of one process (own + reaped children) or of the whole tree."""

    cpu_s: float = 0.0
    read_b: int = 0
    write_b: int = 0


def _plus(a: Usage, b: Usage) -> Usage:
    return Usage(a.cpu_s + b.cpu_s, a.read_b + b.read_b, a.write_b + b.write_b)


def _minus(a: Usage, b: Usage) -> Usage:
    return Usage(a.cpu_s - b.cpu_s, a.read_b - b.read_b, a.write_b - b.write_b)


def _max(a: Usage, b: Usage) -> Usage:
    return Usage(max(a.cpu_s, b.cpu_s), max(a.read_b, b.read_b), max(a.write_b, b.write_b))


class _Sample(NamedTuple):
    ppid: int
    start: float  # with the pid, identifies the process (pid reuse)
    usage: Usage  # read_b/write_b are 0 when /proc/<pid>/io cannot be read
    rss_b: int
    threads: int


class _Gone(Exception):
    """The process no longer exists: it has been reaped."""


class _Unreadable(Exception):
    """The process exists but cannot be read now (permission, zombie on some systems)."""


@dataclass(slots=True)
class _Tracked:
    pid: int
    start: float
    ppid: int
    base: Usage  # part of the counters that is not the run's (see module doc)
    last: Usage  # highest totals seen: the counters only grow, an unreadable io file reads as 0
    rss_b: int = 0
    threads: int = 0


_Scan = list[tuple[int, int, float]]  # (pid, ppid, start) of the root's descendants, parents first


def _bfs(root: int, kids: dict[int, list[tuple[int, float]]]) -> _Scan:
    out: _Scan = []
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


def _all_processes(wanted: Callable[[int], bool]) -> _Scan:
    """(pid, ppid, start) of the wanted processes; listdir shows processes only, not threads."""
    out: _Scan = []
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


class _OpenFiles:
    """/proc files kept open and re-read with pread at offset 0, which makes the kernel render them
    afresh: half the CPU of open+read+close in the real loop (measured). A kept /proc/<pid>/ file
    answers ESRCH once that process is reaped, even if its pid is reused meanwhile."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        # Never crowd the metered process's own descriptors (track() runs inside the training).
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self._limit = 128 if soft == resource.RLIM_INFINITY else min(128, soft // 8)

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


class _ProcfsReader:
    """Linux fast path: /proc/<pid>/stat (cpu, ppid, threads, rss, start) and /proc/<pid>/io."""

    name = "procfs"

    def __init__(self) -> None:
        self._tck = os.sysconf("SC_CLK_TCK")
        self._page_b = os.sysconf("SC_PAGE_SIZE")
        self._files = _OpenFiles()

    def sample(self, pid: int) -> _Sample:
        try:
            f = _stat_fields(self._files.read(f"/proc/{pid}/stat"))
            # man 5 proc numbering minus 3: ppid 4, utime 14 .. cstime 17, threads 20, start 22, rss 24
            cpu_s = (int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])) / self._tck
            ppid, start, rss_b, threads = int(f[1]), int(f[19]), int(f[21]) * self._page_b, int(f[17])
        except (FileNotFoundError, ProcessLookupError):
            raise _Gone from None
        except (OSError, ValueError, IndexError):
            raise _Unreadable from None
        read_b, write_b = self._io(pid)
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

    def scan(self, root: int, root_start: float) -> _Scan:
        kids: dict[int, list[tuple[int, float]]] = {}
        for pid, ppid, start in _all_processes(lambda pid: True):
            if pid == root and start != root_start:
                return []  # the root ended and its pid was reused
            kids.setdefault(ppid, []).append((pid, start))
        return _bfs(root, kids)

    @staticmethod
    def scan_born(since: int, upto: int) -> _Scan:
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


class _PsutilReader:
    """Portable reader: psutil ``oneshot()`` per process, ``children(recursive=True)`` to scan."""

    name = "psutil"

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}  # keeps psutil's per-process caches warm

    def sample(self, pid: int) -> _Sample:
        try:
            proc = self._procs.get(pid) or self._procs.setdefault(pid, psutil.Process(pid))
            with proc.oneshot():
                t = proc.cpu_times()
                cpu_s = t.user + t.system + t.children_user + t.children_system
                read_b, write_b = self._io(proc)
                return _Sample(
                    proc.ppid(), proc.create_time(), Usage(cpu_s, read_b, write_b),
                    proc.memory_info().rss, proc.num_threads(),
                )  # fmt: skip
        except psutil.ZombieProcess:  # a subclass of NoSuchProcess: check first
            raise _Unreadable from None
        except psutil.NoSuchProcess:
            self.forget(pid)
            raise _Gone from None
        except psutil.AccessDenied:
            raise _Unreadable from None

    @staticmethod
    def _io(proc: psutil.Process) -> tuple[int, int]:
        try:
            io = proc.io_counters()  # absent on macOS
        except (AttributeError, psutil.AccessDenied):
            return 0, 0
        return io.read_bytes, io.write_bytes

    def scan(self, root: int, root_start: float) -> _Scan:
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

    def scan_born(self, since: int, upto: int) -> _Scan:
        raise NotImplementedError  # never called: last_pid() is None

    def forget(self, pid: int) -> None:
        self._procs.pop(pid, None)

    def close(self) -> None:
        self._procs.clear()


_Reader = _ProcfsReader | _PsutilReader


def _make_reader(backend: str) -> _Reader:
    if backend == "psutil":
        return _PsutilReader()
    if backend not in ("auto", "procfs"):
        raise ValueError(f"unknown host collector backend {backend!r}: use 'auto', 'procfs' or 'psutil'")
    reader = _ProcfsReader()
    try:
        reader.sample(os.getpid())
    except Exception:
        if backend == "procfs":
            raise
        return _PsutilReader()
    finally:
        reader.forget(os.getpid())
    return reader


# -- host-wide counters ------------------------------------------------------------------------

_Pairs = dict[str, tuple[int, int]]  # device -> (read or rx bytes, write or tx bytes), cumulative


class _SysSample(NamedTuple):
    cpu: tuple[float, float, float | None] | None  # busy, total and iowait CPU-seconds, all CPUs
    mem_used_b: int | None
    disks: _Pairs | None
    nets: _Pairs | None


def _counted_nic(name: str) -> bool:
    # lo is not network; ifb devices mirror a real interface's traffic for shaping (double count)
    return name != "lo" and not name.startswith("ifb")


def _cpu_split(fields: dict[str, float]) -> tuple[float, float, float | None]:
    # guest time is already inside user/nice (what psutil.cpu_percent does too)
    total = sum(v for k, v in fields.items() if k not in ("guest", "guest_nice"))
    iowait = fields.get("iowait")
    return total - fields["idle"] - (iowait or 0.0), total, iowait


class _SystemReader:
    """Host counters from /proc (Linux) or psutil; any part it cannot read is None (DESIGN §2.3)."""

    _CPU_NAMES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")

    def __init__(self, procfs: bool) -> None:
        self._procfs = procfs
        self._tck = os.sysconf("SC_CLK_TCK") if procfs else 0  # /proc/stat counts clock ticks
        self._is_disk: dict[str, bool] = {}
        self._files = _OpenFiles()

    def read(self) -> _SysSample:
        if self._procfs:
            parts = (self._cpu, self._mem, self._disks, self._nets)
        else:
            parts = (self._ps_cpu, self._ps_mem, self._ps_disks, self._ps_nets)
        values = []
        for part in parts:
            try:
                values.append(part())
            except Exception:  # a host counter must never stop the run's own figures
                values.append(None)
        return _SysSample(*values)

    def close(self) -> None:
        self._files.close_all()

    def _cpu(self) -> tuple[float, float, float | None]:
        head = self._files.read("/proc/stat").split(b"\n", 1)[0].split()[1:]
        return _cpu_split({k: int(v) / self._tck for k, v in zip(self._CPU_NAMES, head, strict=False)})

    def _mem(self) -> int:
        data = self._files.read("/proc/meminfo")

        def kib(key: bytes) -> int:
            at = data.index(key) + len(key)
            return int(data[at : data.index(b"\n", at)].split()[0])

        return (kib(b"MemTotal:") - kib(b"MemAvailable:")) * 1024  # psutil's virtual_memory().used

    def _disks(self) -> _Pairs | None:
        out: _Pairs = {}
        for line in self._files.read("/proc/diskstats").splitlines():
            f = line.split()
            if len(f) >= 14 and self._whole_disk(f[2].decode()):
                out[f[2].decode()] = (int(f[5]) * _SECTOR_B, int(f[9]) * _SECTOR_B)
        return out or None  # no disks (a container): absent, not zero

    def _whole_disk(self, name: str) -> bool:
        # as psutil: devices listed in /sys/block, so partitions are not counted twice
        if name not in self._is_disk:
            self._is_disk[name] = os.path.exists("/sys/block/" + name.replace("/", "!"))
        return self._is_disk[name]

    def _nets(self) -> _Pairs:
        out: _Pairs = {}
        for line in self._files.read("/proc/net/dev").splitlines()[2:]:
            name, _, rest = line.partition(b":")
            f = rest.split()
            if _counted_nic(name.strip().decode()):
                out[name.strip().decode()] = (int(f[0]), int(f[8]))
        return out

    @staticmethod
    def _ps_cpu() -> tuple[float, float, float | None]:
        return _cpu_split(psutil.cpu_times()._asdict())

    @staticmethod
    def _ps_mem() -> int:
        return int(psutil.virtual_memory().used)

    @staticmethod
    def _ps_disks() -> _Pairs | None:
        d = psutil.disk_io_counters()
        return None if d is None else {"all": (d.read_bytes, d.write_bytes)}

    @staticmethod
    def _ps_nets() -> _Pairs:
        nics = psutil.net_io_counters(pernic=True)
        return {k: (v.bytes_recv, v.bytes_sent) for k, v in nics.items() if _counted_nic(k)}


def _pairs_delta(prev: _Pairs | None, now: _Pairs | None) -> tuple[int, int] | tuple[None, None]:
    """Bytes moved since ``prev``, over devices present both times; a device whose counter went back
    (reset, re-plugged) adds nothing rather than a negative or made-up figure."""
    if not prev or not now or not (prev.keys() & now.keys()):
        return None, None
    a = b = 0
    for name in prev.keys() & now.keys():
        (a1, b1), (a0, b0) = now[name], prev[name]
        if a1 >= a0 and b1 >= b0:
            a, b = a + a1 - a0, b + b1 - b0
    return a, b


def _system_fields(prev: _SysSample | None, now: _SysSample) -> dict[str, Any]:
    util = iowait = None
    if prev and prev.cpu and now.cpu:
        busy, total = now.cpu[0] - prev.cpu[0], now.cpu[1] - prev.cpu[1]
        util = min(100.0, max(0.0, 100.0 * busy / total)) if total > 0 else None
        if now.cpu[2] is not None and prev.cpu[2] is not None:
            iowait = max(0.0, now.cpu[2] - prev.cpu[2])
    disk_r, disk_w = _pairs_delta(prev and prev.disks, now.disks)
    net_rx, net_tx = _pairs_delta(prev and prev.nets, now.nets)
    return {
        "sys_cpu_util_pct": util, "iowait_s": iowait, "sys_mem_used_b": now.mem_used_b,
        "disk_read_b": disk_r, "disk_write_b": disk_w, "net_rx_b": net_rx, "net_tx_b": net_tx,
    }  # fmt: skip


# -- the collector -----------------------------------------------------------------------------


class ProcessTreeCollector:
    """HostCollector for one run's process tree; the module doc states the accounting rule.

    ``read`` and ``credit_reaped`` may be called from different threads.
    ``backend``: "auto" (the /proc fast path on Linux, else psutil), "procfs" or "psutil".
    """

    def __init__(
        self,
        root_pid: int,
        exclude_pids: Iterable[int] = frozenset(),
        rescan_every: int = 5,
        clock: Callable[[], float] = time.time,
        include_root: bool = True,
        *,
        backend: str = "auto",
    ) -> None:
        self.root_pid = root_pid
        self._exclude = set(exclude_pids) - {root_pid}  # the root is governed by include_root
        self._excluded: dict[int, float] = {}  # pid -> start of processes below an excluded one
        self._rescan_every = max(1, rescan_every)
        self._clock = clock
        self._include_root = include_root
        self._reader = _make_reader(backend)
        self._system = _SystemReader(procfs=self._reader.name == "procfs")
        self._lock = threading.Lock()
        self._live: dict[int, _Tracked] = {}  # insertion order: parents before children
        self._gone: dict[int, _Tracked] = {}  # ended, reaped outside the tree: figure kept
        self._credited = Usage()  # exact figures handed over by credit_reaped, less bases
        self._folded = Usage()  # kept figures too old to be credited any more
        self._reported = Usage()  # the running maximum: cumulative since the first read
        self._root_start: float | None = None
        self._prev_t: float | None = None
        self._prev_sys: _SysSample | None = None
        self._reads_since_scan = 0
        self._pid_at_scan: int | None = None
        self._scans = 0

    @property
    def backend(self) -> str:
        return self._reader.name

    def read(self, now: float | None = None) -> HostTick | None:
        """Usage since the previous read; the first read primes the cursors and returns None."""
        now = self._clock() if now is None else now
        with self._lock:
            if self._prev_t is None:
                self._prime()
                self._prev_t = now
                return None
            vanished = self._refresh()
            self._settle(vanished)
            self._reads_since_scan += 1
            if vanished or self._reads_since_scan >= self._rescan_every:
                self._scan(baseline=False)
            total = _max(self._reported, self._tree_total())
            delta, self._reported = _minus(total, self._reported), total
            system = self._system.read()
            tick = HostTick(
                t0=self._prev_t, t1=now, cpu_s=delta.cpu_s, read_b=delta.read_b, write_b=delta.write_b,
                rss_b=sum(r.rss_b for r in self._live.values()),
                threads=sum(r.threads for r in self._live.values()), procs=len(self._live),
                **_system_fields(self._prev_sys, system),
            )  # fmt: skip
            self._prev_sys, self._prev_t = system, now
            return tick

    def pids(self) -> set[int]:
        """The live processes of the run's tree as of the last read."""
        with self._lock:
            return set(self._live)

    def totals(self) -> Usage:
        """Cumulative tree usage since the first read (the sum of all ticks so far, credits included)."""
        with self._lock:
            return self._reported

    def credit_reaped(self, pid: int, cpu_s: float, read_b: int = 0, write_b: int = 0) -> None:
        """Account the exact final usage of a child the caller reaped itself (``os.wait4``).

        wait4's rusage covers ``pid`` and every descendant reaped inside its subtree. So this
        replaces what was counted for ``pid`` and for its tracked descendants that ended along a
        chain of ended processes (reaped there); descendants still alive were orphaned, keep their
        own figures and get their own credit when reaped. The next ``read`` reports the change.
        """
        with self._lock:
            if pid in self._exclude or pid in self._excluded or pid == self.root_pid:
                return
            rec = self._live.pop(pid, None) or self._gone.pop(pid, None)
            self._reader.forget(pid)
            group = ([rec] if rec else []) + self._reaped_below(pid)
            base = Usage()
            for r in group:
                base = _plus(base, r.base)
            amount = _max(_minus(Usage(cpu_s, read_b, write_b), base), Usage())
            if rec is not None:  # never less than we saw of it (read_b/write_b may be unknown: 0)
                amount = _max(amount, _minus(rec.last, rec.base))
            self._credited = _plus(self._credited, amount)

    def close(self) -> None:
        """Let go of the kept-open /proc files; counters stay readable through ``totals``."""
        with self._lock:
            self._reader.close()
            self._system.close()
            self._live.clear()
            self._gone.clear()

    # -- internals (called with the lock held) ------------------------------------------------

    def _prime(self) -> None:
        try:
            self._root_start = self._reader.sample(self.root_pid).start
        except (_Gone, _Unreadable):
            self._root_start = None  # nothing to meter; reads still report the host
        if self._include_root and self._root_start is not None:
            self._track(self.root_pid, baseline=True)
        self._scan(baseline=self._include_root)
        self._reads_since_scan = self._rescan_every - 1  # CMD usually starts right after: look again soon
        self._prev_sys = self._system.read()

    def _refresh(self) -> list[_Tracked]:
        vanished: list[_Tracked] = []
        for rec in reversed(list(self._live.values())):  # children before parents (module doc)
            try:
                s = self._reader.sample(rec.pid)
            except _Gone:
                vanished.append(rec)
                continue
            except _Unreadable:
                continue  # keep its last figures; try again next read
            if s.start != rec.start:
                vanished.append(rec)  # ended, pid reused: the newcomer is found by the scan
                continue
            rec.ppid, rec.last, rec.rss_b, rec.threads = s.ppid, _max(rec.last, s.usage), s.rss_b, s.threads
        for rec in vanished:
            del self._live[rec.pid]
            self._reader.forget(rec.pid)
        return vanished

    def _settle(self, vanished: list[_Tracked]) -> None:
        by_pid = {r.pid: r for r in vanished}
        for rec in vanished:
            parent = self._live_ancestor(rec, by_pid)
            if parent is not None:
                # Reaped inside the tree: its final figure is in the parent's counters, which must
                # not count the part that predates metering either.
                parent.base = _plus(parent.base, rec.base)
            else:
                self._keep(rec)

    def _live_ancestor(self, rec: _Tracked, vanished: dict[int, _Tracked]) -> _Tracked | None:
        ppid = rec.ppid
        for _ in range(len(vanished) + 1):  # bounded: a pid cycle cannot loop forever
            if ppid not in vanished:
                return self._live.get(ppid)
            ppid = vanished[ppid].ppid
        return None

    def _keep(self, rec: _Tracked) -> None:
        if rec.pid in self._gone:
            self._fold(self._gone.pop(rec.pid))  # pid reused: the older one can no longer be credited
        self._gone[rec.pid] = rec
        while len(self._gone) > _MAX_GONE:
            self._fold(self._gone.pop(next(iter(self._gone))))

    def _fold(self, rec: _Tracked) -> None:
        self._folded = _plus(self._folded, _minus(rec.last, rec.base))

    def _scan(self, baseline: bool) -> None:
        pid_now = self._reader.last_pid()
        self._reads_since_scan = 0
        if self._root_start is None or (pid_now is not None and pid_now == self._pid_at_scan):
            return  # no process was born since the last scan
        since, self._pid_at_scan = self._pid_at_scan, pid_now
        self._scans += 1
        if since is None or pid_now is None or self._scans % _FULL_SCAN_EVERY == 0:
            self._adopt(self._reader.scan(self.root_pid, self._root_start), baseline, whole_tree=True)
        else:  # only processes born since the last scan: the others are tracked already
            self._adopt(self._reader.scan_born(since, pid_now), baseline, whole_tree=False)

    def _adopt(self, found: _Scan, baseline: bool, whole_tree: bool) -> None:
        """Track what ``found`` (parents first) adds to the tree; remember what sits below an exclusion."""
        for pid, ppid, start in found:
            if pid in self._live:
                continue
            below_excluded = ppid in self._exclude or (ppid in self._excluded and ppid not in self._live)
            if pid in self._exclude or below_excluded or self._excluded.get(pid) == start:
                self._excluded[pid] = start  # sticky: it stays out after being re-parented
            elif whole_tree or ppid == self.root_pid or ppid in self._live:
                self._excluded.pop(pid, None)  # an ended excluded process had this pid
                self._track(pid, baseline)

    def _track(self, pid: int, baseline: bool) -> None:
        try:
            s = self._reader.sample(pid)
        except (_Gone, _Unreadable):
            return
        base = s.usage if baseline else Usage()
        self._live[pid] = _Tracked(pid, s.start, s.ppid, base, s.usage, s.rss_b, s.threads)

    def _reaped_below(self, pid: int) -> list[_Tracked]:
        """Tracked descendants of ``pid`` that ended along a chain of ended processes; removed."""
        kids: dict[int, list[_Tracked]] = {}
        for r in chain(self._live.values(), self._gone.values()):
            kids.setdefault(r.ppid, []).append(r)
        out: list[_Tracked] = []
        queue, seen = [pid], {pid}
        for parent in queue:
            for r in kids.get(parent, ()):
                live = self._live.get(r.pid) is r  # (a kept record's pid may belong to a newer process)
                if r.pid in seen or (live and self._alive(r)):
                    continue  # orphaned, not reaped: not part of this rusage
                if live:
                    del self._live[r.pid]
                    self._reader.forget(r.pid)
                else:
                    del self._gone[r.pid]
                out.append(r)
                queue.append(r.pid)
                seen.add(r.pid)
        return out

    def _alive(self, rec: _Tracked) -> bool:
        try:
            return self._reader.sample(rec.pid).start == rec.start
        except _Gone:
            return False
        except _Unreadable:
            return True

    def _tree_total(self) -> Usage:
        cpu_s, read_b, write_b = _plus(self._credited, self._folded)
        for r in chain(self._live.values(), self._gone.values()):  # per read: plain sums, no tuples
            cpu_s += r.last.cpu_s - r.base.cpu_s
            read_b += r.last.read_b - r.base.read_b
            write_b += r.last.write_b - r.base.write_b
        return Usage(cpu_s, read_b, write_b)
