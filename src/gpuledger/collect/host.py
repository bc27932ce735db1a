"""Host collector: CPU, memory and storage I/O of a run's process tree, plus host-wide counters.

The tree
    Every process below ``root_pid`` (and ``root_pid`` itself when ``include_root``), except
    ``exclude_pids`` and everything below them. Membership is sticky: a process seen once stays the
    run's until it ends, even after it is re-parented out of the tree (an orphan adopted by init).
    ``gpuledger run``: root = gpuledger with ``include_root=False`` (a subreaper, so CMD's orphans
    come back below the root), the output relay excluded. ``gpuledger.track()``: root = the current
    process with ``include_root=True``, so its own sampler thread's CPU (and the recorder's own
    ledger writes) are part of the run: small, and cheaper than subtracting them.

Counters (docs/ARCHITECTURE.md, principle 2)
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
    Known gaps: CPU and I/O between the last read (of I/O counters, for I/O) and the end of a
    process reaped outside the tree and never credited (only without a subreaper); children of a
    parent that ignores SIGCHLD (the kernel folds nothing into it: lost); a process born and
    orphaned to init between two scans;
    shared pages count once per process in ``rss_b``; writes later cancelled by a truncate count;
    with the psutil reader, a pid reused between two reads (the /proc reader notices).
    A credit lands in the tick of the next ``read``: read once more after the last credit.

Host-wide counters (system.py: CPU split, iowait, memory, disk and network bytes)
    They are cumulative, so they are read only every ``system_every`` reads and at every read made
    with ``closes_interval`` (the recorder says which reads end an interval, regular close, epoch cut
    or stop); their delta since the previous host-wide read lands in the tick that reads them, with
    ``sys_t0`` saying where that span began. Since every interval ends with a host-wide read, a delta
    never spans two intervals: each interval's sums are over its own span. A read that raises
    moves no cursor (tree or host-wide), so the next read covers the time since the last good one; a
    part that cannot be read (None) leaves its delta absent on both sides of that read, never
    stretched over a longer span. The psutil fallback reads the same counters, with the same rule.

Per-process I/O counters
    Cumulative as well, so they follow the same cadence: read every ``io_every`` reads (default: as
    often as the host-wide counters) and at every read with ``closes_interval``; in between, each
    process keeps its last I/O figure, and the next reading brings the difference. Each interval's
    I/O is still its own, and it is what is stored; only a process that ends reaped outside the
    tree and uncredited loses more (Known gaps), which is why the node agent, which has no
    wait4 credits, reads them every time.

Cost (benchmarks/host_tick.py measures it in the real loop)
    Reading is procfs.py's (per process: a /proc fast path on Linux, psutil elsewhere or with
    ``backend="psutil"``) and system.py's (the host-wide counters). The tree is scanned every
    ``rescan_every`` reads and after a tracked process ended, only if the kernel handed out a pid
    since the last scan (/proc/loadavg), and then reads only the processes born since (pid by pid
    when few pids were handed out, else from a listing of /proc; a whole scan every
    ``_FULL_SCAN_EVERY`` scans). Otherwise a tick reads one kept-open stat file per process (and
    its io file at the I/O cadence) and allocates little: benchmarks/recorder_tick.py times it in
    the recorder's real loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import chain

from gpuledger.collect.procfs import Gone, Scan, Unreadable, Usage, make_reader
from gpuledger.collect.system import SysSample, SystemReader, system_fields
from gpuledger.core.model import HostTick

_MAX_GONE = 4096  # kept figures of ended processes awaiting a credit; beyond this the oldest are folded
# In between, a scan reads only the processes born since the previous one, which sees every pid
# handed out; a whole scan (every process's stat: ~2 ms on a 2-core VM with 170 processes) is only
# the safety net, every 5 minutes at the default cadence.
_FULL_SCAN_EVERY = 60


# Usage(a, b, c) runs the named tuple's __new__, a Python function; this builds the same tuple
# in C at a quarter of the cost, and the read path makes several every tick.
_new = tuple.__new__


def _plus(a: Usage, b: Usage) -> Usage:
    return _new(Usage, (a.cpu_s + b.cpu_s, a.read_b + b.read_b, a.write_b + b.write_b))


def _minus(a: Usage, b: Usage) -> Usage:
    return _new(Usage, (a.cpu_s - b.cpu_s, a.read_b - b.read_b, a.write_b - b.write_b))


def _max(a: Usage, b: Usage) -> Usage:
    # Comparisons, not max(): the builtin parses its arguments by keyword at every call (3.11),
    # and this runs at every read.
    return _new(
        Usage,
        (
            a.cpu_s if a.cpu_s >= b.cpu_s else b.cpu_s,
            a.read_b if a.read_b >= b.read_b else b.read_b,
            a.write_b if a.write_b >= b.write_b else b.write_b,
        ),
    )


@dataclass(slots=True)
class _Tracked:
    pid: int
    start: float
    ppid: int
    base: Usage  # part of the counters that is not the run's (see module doc)
    last: Usage  # highest totals seen: the counters only grow, an unreadable io file reads as 0
    rss_b: int = 0
    threads: int = 0


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
        system_every: int = 1,
        system: SystemReader | None = None,
        io_every: int | None = None,
    ) -> None:
        self.root_pid = root_pid
        # The host-wide counters are cumulative, so reading them every few reads keeps their sums
        # exact while sparing most of their cost; a read that closes an interval reads them too
        # (module doc: "Host-wide counters"). The processes' I/O counters likewise (None: as often).
        self._system_every = max(1, system_every)
        self._reads_since_sys = 0
        self._io_every = self._system_every if io_every is None else max(1, io_every)
        self._reads_since_io = 0
        self._exclude = set(exclude_pids) - {root_pid}  # the root is governed by include_root
        self._excluded: dict[int, float] = {}  # pid -> start of processes below an excluded one
        self._rescan_every = max(1, rescan_every)
        self._clock = clock
        self._include_root = include_root
        self._reader = make_reader(backend)
        self._system = SystemReader(procfs=self._reader.name == "procfs") if system is None else system
        self._lock = threading.Lock()
        self._live: dict[int, _Tracked] = {}  # insertion order: parents before children
        self._gone: dict[int, _Tracked] = {}  # ended, reaped outside the tree: figure kept
        self._credited = Usage()  # exact figures handed over by credit_reaped, less bases
        self._reaped_peak = 0  # the largest ru_maxrss credited since the last read
        self._own_peak = 0  # of those, the largest known to be the process's own (credit_reaped)
        self._tree_seen = False  # a reading found a process of the tree with memory
        self._folded = Usage()  # kept figures too old to be credited any more
        self._reported = Usage()  # the running maximum: cumulative since the first read
        self._root_start: float | None = None
        self._prev_t: float | None = None
        self._prev_sys: SysSample | None = None
        self._prev_sys_t: float | None = None  # when _prev_sys was read
        self._reads_since_scan = 0
        self._pid_at_scan: int | None = None
        self._scans = 0

    @property
    def backend(self) -> str:
        return self._reader.name

    def read(self, now: float | None = None, closes_interval: bool = False) -> HostTick | None:
        """Usage since the previous read; the first read primes the cursors and returns None.

        ``closes_interval``: this read ends a recording interval, so the host-wide counters are read
        too and none of their delta crosses the interval's end. A read that raises moves no cursor:
        the next one covers the time since the last read that returned.
        """
        now = self._clock() if now is None else now
        with self._lock:
            if self._prev_t is None:
                self._prime(now)
                self._prev_t = now
                return None
            io = closes_interval or self._reads_since_io + 1 >= self._io_every
            vanished = self._refresh(io)
            if vanished:
                self._settle(vanished)
            self._reads_since_scan += 1
            # An empty tree is scanned at every read: a command that started just after the
            # previous scan (a slow exec under load) must not go unseen until the next one.
            if vanished or not self._live or self._reads_since_scan >= self._rescan_every:
                self._scan(baseline=False)
            total = _max(self._reported, self._tree_total())
            system = self._system_due(closes_interval)
            # Nothing above moved a cursor the deltas are taken from: from here on, nothing raises.
            delta, self._reported = _minus(total, self._reported), total
            rss_b = threads = 0
            for r in self._live.values():  # one plain loop: two sum() generators cost twice as much
                rss_b += r.rss_b
                threads += r.threads
            self._tree_seen = self._tree_seen or rss_b > 0
            tick = HostTick(
                t0=self._prev_t, t1=now, cpu_s=delta.cpu_s, read_b=delta.read_b, write_b=delta.write_b,
                rss_b=max(rss_b if self._tree_seen else max(rss_b, self._reaped_peak), self._own_peak),
                threads=threads, procs=len(self._live),
                **(self._system_since(system, now) if system is not None else {}),
            )  # fmt: skip
            self._prev_t, self._reaped_peak, self._own_peak = now, 0, 0
            self._reads_since_io = 0 if io else self._reads_since_io + 1
            return tick

    def _system_due(self, closes_interval: bool) -> SysSample | None:
        """A fresh host-wide reading when this read closes an interval or ends the cadence, else None."""
        if not closes_interval and self._reads_since_sys + 1 < self._system_every:
            self._reads_since_sys += 1
            return None
        return self._system.read()

    def _system_since(self, system: SysSample, now: float) -> dict:
        """The tick's host-wide fields: what changed since the previous host-wide read, (sys_t0, now]."""
        fields = system_fields(self._prev_sys, system)
        fields["sys_t0"] = self._prev_sys_t
        self._prev_sys, self._prev_sys_t, self._reads_since_sys = system, now, 0
        return fields

    def exclude(self, pid: int) -> None:
        """Leave ``pid`` (and what it starts) out of the tree from the next read on: a helper started
        after the collector's first read (``gpuledger run`` reads it before launching CMD and its relay)."""
        with self._lock:
            if pid != self.root_pid:
                self._exclude.add(pid)

    def pids(self) -> set[int]:
        """The live processes of the run's tree as of the last read."""
        with self._lock:
            return set(self._live)

    def totals(self) -> Usage:
        """Cumulative tree usage since the first read (the sum of all ticks so far, credits included)."""
        with self._lock:
            return self._reported

    def credit_reaped(
        self, pid: int, cpu_s: float, read_b: int = 0, write_b: int = 0, max_rss_b: int = 0, own_rss: bool = False
    ) -> None:
        """Account the exact final usage of a child the caller reaped itself (``os.wait4``).

        wait4's rusage covers ``pid`` and every descendant reaped inside its subtree. So this
        replaces what was counted for ``pid`` and for its tracked descendants that ended along a
        chain of ended processes (reaped there); descendants still alive were orphaned, keep their
        own figures and get their own credit when reaped. The next ``read`` reports the change.
        ``max_rss_b`` (wait4's ``ru_maxrss``: the largest resident set of ``pid`` and what it
        reaped) is the tree's memory only while no reading has seen the tree: a command that ended
        before any reading saw it still has a measured peak, never a made-up 0. Once a reading saw
        it, the readings are its peak: Linux's ru_maxrss also counts the image the process was
        forked from before its exec (gpuledger's own memory, for CMD), which is not the run's.
        ``own_rss``: the caller knows ``max_rss_b`` is above that image (larger than the reaper's
        own peak), so it is the process's own peak: it counts even after readings saw the tree
        (a reading that caught the command starting up is not its peak).
        """
        with self._lock:
            self._reaped_peak = max(self._reaped_peak, max_rss_b)
            if own_rss:
                self._own_peak = max(self._own_peak, max_rss_b)
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

    def _prime(self, now: float) -> None:
        try:
            self._root_start = self._reader.sample(self.root_pid).start
        except (Gone, Unreadable):
            self._root_start = None  # nothing to meter; reads still report the host
        if self._include_root and self._root_start is not None:
            self._track(self.root_pid, baseline=True)
        self._scan(baseline=self._include_root)
        self._reads_since_scan = self._rescan_every - 1  # CMD usually starts right after: look again soon
        self._prev_sys, self._prev_sys_t = self._system.read(), now

    def _refresh(self, io: bool) -> list[_Tracked]:
        """Read every live process; ``io``: its I/O counters too (else each keeps its last figure)."""
        vanished: list[_Tracked] = []
        stat, read_io = self._reader.stat, self._reader.io
        # Children before parents (module doc); nothing is added or removed during the walk.
        for rec in reversed(self._live.values()):
            try:
                ppid, start, cpu_s, rss_b, threads = stat(rec.pid)
            except Gone:
                vanished.append(rec)
                continue
            except Unreadable:
                continue  # keep its last figures; try again next read
            if start != rec.start:
                vanished.append(rec)  # ended, pid reused: the newcomer is found by the scan
                continue
            last = rec.last
            if io:  # never below a figure seen (an unreadable io file reads as 0)
                read_b, write_b = read_io(rec.pid)
                rec.last = _max(last, _new(Usage, (cpu_s, read_b, write_b)))
            elif cpu_s > last.cpu_s:  # a new Usage only when the figure moved
                rec.last = _new(Usage, (cpu_s, last.read_b, last.write_b))
            rec.ppid, rec.rss_b, rec.threads = ppid, rss_b, threads
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

    def _adopt(self, found: Scan, baseline: bool, whole_tree: bool) -> None:
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
        except (Gone, Unreadable):
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
        except Gone:
            return False
        except Unreadable:
            return True

    def _tree_total(self) -> Usage:
        cpu_s, read_b, write_b = _plus(self._credited, self._folded)
        for r in chain(self._live.values(), self._gone.values()):  # per read: plain sums, no tuples
            cpu_s += r.last.cpu_s - r.base.cpu_s
            read_b += r.last.read_b - r.base.read_b
            write_b += r.last.write_b - r.base.write_b
        return _new(Usage, (cpu_s, read_b, write_b))
