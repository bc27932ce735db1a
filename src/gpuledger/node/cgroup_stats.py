"""Host figures of a container, pod or Slurm step from its cgroup: a HostCollector over cgroup files.

The kernel keeps a cgroup's counters for all its processes, those that ended included, so a
container's CPU, memory and I/O are exact without following its processes one by one:

================  ==============================================  ====================================
figure            cgroup v2                                       cgroup v1
================  ==============================================  ====================================
CPU seconds       ``cpu.stat`` ``usage_usec``                     ``cpuacct/cpuacct.usage`` (ns)
storage bytes     ``io.stat`` ``rbytes``/``wbytes``, all devices  ``blkio/blkio.throttle.io_service_
                                                                  bytes_recursive`` Read/Write
memory            ``memory.current`` − ``inactive_file``          ``memory.usage_in_bytes`` −
                  (``memory.stat``), the working set              ``total_inactive_file``
memory peak       ``memory.peak`` (Linux 5.19+)                   ``memory.max_usage_in_bytes``
threads           ``pids.current`` (else ``cgroup.threads``)      ``pids/pids.current`` (else ``tasks``)
processes         ``cgroup.procs`` of the cgroup and below        the same, in the cpuacct hierarchy
================  ==============================================  ====================================

Memory is the *working set* (charged memory less the inactive file cache), the figure the kubelet
and ``docker stats`` show. It is sampled every tick; the peak file is the cgroup's lifetime peak
of charged memory, so when it rose during an interval, that interval's peak was reached inside
it: the closing reading then reports ``memory.peak − inactive_file``, never less than the samples.
Each figure is read where its controller is. A hybrid host (v1 controllers under
``<root>/<controller>``, an empty cgroup v2 tree at ``<root>/unified``) keeps memory, blkio, pids
and cpuacct in v1; its unified directory has ``cpu.stat`` and ``cgroup.procs`` only, and taking
it for the container's cgroup read memory, I/O and threads as 0 (tests/data/cgroup/hybrid-v1 is
such a host, recorded). A figure whose controller is on the cgroup in neither hierarchy is not
available, never 0: without memory or storage counters the cgroup is not read at all
(``CgroupFiles.missing``), and the agent measures the run from its process tree instead. A counter
that goes backwards (the cgroup was re-created) counts from its new value.

Host-wide counters (CPU split, iowait, memory, disk, network) are read at every reading that ends
an interval, as for a wrapped run (collect/host.py), so each interval's figures cover its span.
"""

from __future__ import annotations

import os
import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuledger.collect.system import SysSample, SystemReader, system_fields
from gpuledger.core.metering.cgroup_path import CgroupFacts
from gpuledger.core.model import HostTick

_V1_CPU_DIRS = ("cpuacct", "cpu,cpuacct", "cpuacct,cpu")
_V1_IO_FILES = ("blkio.throttle.io_service_bytes_recursive", "blkio.throttle.io_service_bytes",
                "blkio.io_service_bytes_recursive")  # fmt: skip
# The file that proves a controller's counters are there: v1 directory name, v1 file, v2 file.
_COUNTERS = {
    "memory": ("memory", ("memory.usage_in_bytes",), "memory.current"),
    "io": ("blkio", _V1_IO_FILES, "io.stat"),
    "pids": ("pids", ("pids.current",), "pids.current"),
}
NEEDED = ("memory", "io")  # figures with no stand-in: without them the process tree is read instead


@dataclass(frozen=True)
class Source:
    """One controller's directory and the cgroup version of its files."""

    path: str
    version: int


@dataclass(frozen=True)
class CgroupFiles:
    """Where one cgroup's counters are, controller by controller: a hybrid host keeps some in v1
    hierarchies and others (or none) in the unified one."""

    cpu: Source  # cpu.stat (v2) / cpuacct.usage (v1); its directory also lists the processes
    memory: Source | None
    io: Source | None
    pids: Source | None

    @property
    def missing(self) -> tuple[str, ...]:
        """The figures this cgroup has no counter for, of those with no stand-in (``NEEDED``)."""
        return tuple(name for name in NEEDED if getattr(self, name) is None)


def locate(cgroup_root: str, facts: CgroupFacts) -> CgroupFiles | None:
    """The directories of a process's container / pod / step cgroup, or None (no such scope, a path
    outside our cgroup namespace we cannot place, or a hierarchy not mounted under ``cgroup_root``).

    Each figure is taken from where its counter file is: a v1 controller's hierarchy
    (``<root>/memory/<scope>``), else the v2 directory (``<root>/<scope>`` on a v2 host,
    ``<root>/unified/<scope>`` on a hybrid one). A hybrid host's v2 directory has ``cpu.stat`` and
    ``cgroup.procs`` but none of the v1 controllers' files: it is used only for what it has.

    A path that climbs out of the agent's cgroup namespace (``/../..``: the agent runs in a
    container, e.g. the DaemonSet, with the host's cgroup hierarchy mounted at ``cgroup_root``) is
    placed from where the namespace's root sits in that hierarchy (``namespace_root``; cgroup v2).
    """
    scope = facts.scope
    if scope is None:
        return None
    if facts.outside_ns:
        scope = _outside(cgroup_root, facts, scope)
        if scope is None:
            return None
    root = cgroup_root.rstrip("/")
    # Only a v2 directory has cgroup.controllers; a v1 hierarchy mounted at the root does not.
    v2 = next((d for d in (f"{root}{scope}", f"{root}/unified{scope}") if os.path.isfile(f"{d}/cgroup.controllers")),
              None)  # fmt: skip
    cpu1 = next((f"{root}/{n}{scope}" for n in _V1_CPU_DIRS if os.path.isfile(f"{root}/{n}{scope}/cpuacct.usage")),
                None)  # fmt: skip
    if cpu1 is not None:
        cpu = Source(cpu1, 1)
    elif v2 is not None and os.path.isfile(f"{v2}/cpu.stat"):
        cpu = Source(v2, 2)
    else:
        return None
    found = {name: _counter(root, scope, v2, *spec) for name, spec in _COUNTERS.items()}
    return CgroupFiles(cpu, found["memory"], found["io"], found["pids"])


def _counter(
    root: str, scope: str, v2: str | None, v1_dir: str, v1_files: tuple[str, ...], v2_file: str
) -> Source | None:
    d = f"{root}/{v1_dir}{scope}"
    if any(os.path.isfile(f"{d}/{name}") for name in v1_files):
        return Source(d, 1)
    if v2 is not None and os.path.isfile(f"{v2}/{v2_file}"):
        return Source(v2, 2)
    return None  # the controller is on neither: the figure is not available, never 0


# -- paths outside the agent's cgroup namespace --------------------------------------------------

_NS_ROOTS: dict[str, str | None] = {}
_MAX_DIRS = 50_000  # a bound on the one-time search of the host hierarchy


def _outside(cgroup_root: str, facts: CgroupFacts, scope: str) -> str | None:
    unified = next((p.path for p in facts.paths if p.unified and p.path.startswith("/..")), None)
    if unified is None:
        return None  # cgroup v1 hierarchies each have their own namespace root: not placed
    ns_root = namespace_root(cgroup_root)
    if ns_root is None:
        return None
    ups = unified.split("/").count("..")  # the climb out of the namespace: only at its start
    return posixpath.normpath(ns_root + "/.." * ups + scope)


def namespace_root(cgroup_root: str, pid: int | None = None, proc: str = "/proc") -> str | None:
    """Where this process's cgroup namespace root is in the hierarchy mounted at ``cgroup_root``.

    Found once: the directory whose ``cgroup.procs`` lists this process (``hostPID``: pids there are
    the host's, as ours) is its cgroup in host terms; less the path the namespace shows for it.
    None when it cannot be found (then such paths are not placed, and host figures come from /proc).
    """
    key = cgroup_root
    if key in _NS_ROOTS:
        return _NS_ROOTS[key]
    pid = os.getpid() if pid is None else pid
    try:
        with open(f"{proc}/{pid}/cgroup", encoding="utf-8") as fh:
            own = next((line.split(":", 2)[2].strip() for line in fh if line.startswith("0::")), None)
    except OSError:
        own = None
    found = None if own is None or own.startswith("/..") else _find_procs_dir(cgroup_root, pid)
    if found is not None:
        host_own = "/" + os.path.relpath(found, cgroup_root).replace(os.sep, "/").lstrip("./")
        rel = own.rstrip("/")
        found = host_own[: len(host_own) - len(rel)] if rel and host_own.endswith(rel) else host_own
        found = found.rstrip("/") or "/"
    _NS_ROOTS[key] = found
    return found


def _find_procs_dir(cgroup_root: str, pid: int) -> str | None:
    want = str(pid)
    seen = 0
    for dirpath, dirnames, filenames in os.walk(cgroup_root):
        seen += 1
        if seen > _MAX_DIRS:
            return None
        if "cgroup.procs" in filenames:
            try:
                with open(os.path.join(dirpath, "cgroup.procs"), encoding="ascii", errors="replace") as fh:
                    if want in fh.read().split():
                        return dirpath
            except OSError:
                continue
        dirnames.sort(key=lambda d: "kubepods" not in d)  # where a DaemonSet's pod usually is
    return None


# -- parsing (pure) -----------------------------------------------------------------------------


def cpu_seconds_v2(cpu_stat: str) -> float | None:
    for line in cpu_stat.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec" and value.strip().isdigit():
            return int(value) / 1e6
    return None


def io_bytes_v2(io_stat: str) -> tuple[int, int]:
    """Sum of rbytes and wbytes over the devices of ``io.stat``."""
    rd = wr = 0
    for line in io_stat.splitlines():
        for item in line.split()[1:]:
            key, _, value = item.partition("=")
            if value.isdigit():
                if key == "rbytes":
                    rd += int(value)
                elif key == "wbytes":
                    wr += int(value)
    return rd, wr


def io_bytes_v1(service_bytes: str) -> tuple[int, int]:
    """Sum of the Read and Write lines (``8:0 Read 4096``) of blkio's io_service_bytes."""
    rd = wr = 0
    for line in service_bytes.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2].isdigit():
            if parts[1] == "Read":
                rd += int(parts[2])
            elif parts[1] == "Write":
                wr += int(parts[2])
    return rd, wr


def stat_value(memory_stat: str, key: str) -> int | None:
    for line in memory_stat.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


def interval_peak(samples_max: int, peak_now: int | None, peak_before: int | None, inactive: int) -> int:
    """The interval's memory peak: the samples, unless the cgroup's lifetime peak rose meanwhile."""
    if peak_now is None or peak_before is None or peak_now <= peak_before:
        return samples_max
    return max(samples_max, peak_now - inactive)


# -- the collector ------------------------------------------------------------------------------


class CgroupCollector:
    """HostCollector over one cgroup's counters (module doc). ``read`` never raises: a cgroup that
    went away (the container was removed) reads as no further usage."""

    def __init__(
        self,
        files: CgroupFiles,
        *,
        system: SystemReader | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if files.missing:
            raise ValueError(f"the cgroup at {files.cpu.path} has no {' or '.join(files.missing)} counter")
        self.files = files
        self._system = SystemReader(procfs=True) if system is None else system
        self._clock = clock
        self._prev_t: float | None = None
        self._cpu: float | None = None
        self._io: tuple[int, int] = (0, 0)
        self._peak: int | None = None  # lifetime peak at the last closing reading
        self._procs = 0
        self._prev_sys: SysSample | None = None
        self._prev_sys_t: float | None = None
        self.gone = False

    def read(self, now: float | None = None, closes_interval: bool = False) -> HostTick | None:
        now = self._clock() if now is None else now
        cpu = self._cpu_s()
        io = self._io_b()
        if self._prev_t is None:
            self._prev_t, self._cpu, self._io = now, cpu, io
            self._peak = self._peak_b()
            self._procs = self._count_procs()
            self._prev_sys, self._prev_sys_t = self._system.read(), now
            return None
        self.gone = cpu is None
        cpu_delta = _delta(self._cpu, cpu)
        rd, wr = _delta(self._io[0], io[0]), _delta(self._io[1], io[1])
        working, inactive = self._working_set()
        threads = self._threads()
        if closes_interval:
            peak = self._peak_b()
            working = interval_peak(working, peak, self._peak, inactive)
            self._peak = peak if peak is not None else self._peak
            self._procs = self._count_procs()
        tick = HostTick(
            t0=self._prev_t, t1=now, cpu_s=cpu_delta, rss_b=working, read_b=int(rd), write_b=int(wr),
            threads=threads if threads is not None else self._procs, procs=self._procs,
        )  # fmt: skip
        if closes_interval:
            sample = self._system.read()
            fields = system_fields(self._prev_sys, sample)
            for key, value in fields.items():
                setattr(tick, key, value)
            tick.sys_t0 = self._prev_sys_t
            self._prev_sys, self._prev_sys_t = sample, now
        self._prev_t = now
        if cpu is not None:
            self._cpu = cpu
        self._io = io
        return tick

    def pids(self) -> set[int]:
        return set()  # the cgroup's counters cover its processes: none to follow one by one

    def close(self) -> None:
        self._system.close()

    # -- files ----------------------------------------------------------------------------------
    def _cpu_s(self) -> float | None:
        cpu = self.files.cpu
        if cpu.version == 2:
            text = _read(f"{cpu.path}/cpu.stat")
            return None if text is None else cpu_seconds_v2(text)
        ns = _int_file(f"{cpu.path}/cpuacct.usage")
        return None if ns is None else ns / 1e9

    def _io_b(self) -> tuple[int, int]:
        io = self.files.io
        assert io is not None  # __init__: a cgroup without an I/O counter is not read here
        if io.version == 2:
            return io_bytes_v2(_read(f"{io.path}/io.stat") or "")
        for name in _V1_IO_FILES:
            text = _read(f"{io.path}/{name}")
            if text:
                return io_bytes_v1(text)
        return (0, 0)  # every file empty: no I/O yet (the kernel prints nothing then)

    def _working_set(self) -> tuple[int, int]:
        mem = self.files.memory
        assert mem is not None  # __init__
        v2 = mem.version == 2
        current = _int_file(f"{mem.path}/memory.current" if v2 else f"{mem.path}/memory.usage_in_bytes")
        inactive = stat_value(_read(f"{mem.path}/memory.stat") or "", "inactive_file" if v2 else "total_inactive_file")
        if current is None:
            return 0, 0  # the cgroup went away: no further usage
        inactive = min(inactive or 0, current)
        return current - inactive, inactive

    def _peak_b(self) -> int | None:
        mem = self.files.memory
        if mem is None:
            return None
        return _int_file(f"{mem.path}/memory.peak" if mem.version == 2 else f"{mem.path}/memory.max_usage_in_bytes")

    def _threads(self) -> int | None:
        """``pids.current``; without the pids controller, the thread ids the cgroup lists."""
        pids = self.files.pids
        if pids is not None:
            return _int_file(f"{pids.path}/pids.current")
        name = "cgroup.threads" if self.files.cpu.version == 2 else "tasks"
        return self._count_ids(name) or None

    def _count_procs(self) -> int:
        return self._count_ids("cgroup.procs")

    def _count_ids(self, name: str) -> int:
        n = 0
        for dirpath, _dirs, files in os.walk(self.files.cpu.path):
            if name in files:
                n += len((_read(f"{dirpath}/{name}") or "").split())
        return n


def _delta(before: float | int | None, now: float | int | None) -> float:
    if now is None or before is None:
        return 0.0
    return now - before if now >= before else now  # re-created cgroup: counts from its new value


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _int_file(path: str) -> int | None:
    text = _read(path)
    text = text.strip() if text is not None else ""
    return int(text) if text.isdigit() else None
