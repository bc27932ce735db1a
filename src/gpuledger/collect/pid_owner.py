"""Facts from /proc for telling which GPU processes are a run's (the rules are core/metering/gpu_procs.py).

* **Foreign PID namespace.** The kernel thread ``kthreadd`` is pid 2 with parent 0 only in the
  initial PID namespace (a child namespace cannot see kernel threads). If the /proc we read does
  not show it, the pids we know (the run's) are not the host pids NVML reports.
* **Verified pid.** In the initial namespace a listed pid that is one of the run's processes is
  the run's. In a foreign namespace a listed pid may be a host pid that happens to equal one of
  ours; it counts only if that process really holds an NVIDIA device file (the driver translated
  the list, as some recent drivers do).
* **Device-node holders.** A CUDA process keeps ``/dev/nvidia<minor>`` open for each GPU it
  uses; how many of the run's processes hold a GPU's node bounds how many of that GPU's processes
  can be the run's.
* **Job scope.** A process outside the run's tree but inside the same container (a 64-hex
  container id in its cgroup path) or Slurm job (``job_<id>``) — an ``srun`` step, say — is the
  run's by cgroup. Only visible where the host's processes are (initial namespace). The paths are
  read by ``core/metering/cgroup_path.py``, the parser the node agent attributes processes with.

File descriptors and cgroups are read at most every ``REFRESH_S`` per process: they change when a
process initialises CUDA, not every tick. ``verdict_until`` says until when a verdict made from
these facts stays what they would say again (the collector reuses it until then).
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable, Iterable

from gpuledger.core.metering.cgroup_path import read_cgroup
from gpuledger.core.metering.gpu_procs import PROC_CGROUP, PROC_PID

REFRESH_S = 30.0
_NVIDIA_NODE = re.compile(r"^/dev/nvidia(\d+)$")


def job_scope(cgroup_lines: Iterable[str]) -> str | None:
    """The container or Slurm-job part of a process's cgroup path, or None (a shared session)."""
    return read_cgroup(cgroup_lines).job_scope


class PidOwner:
    """Reads the /proc facts for one run's processes; ``procfs`` is configurable for tests."""

    def __init__(self, procfs: str = "/proc", clock: Callable[[], float] = time.monotonic) -> None:
        self._proc = procfs
        self._clock = clock
        self.foreign_ns = not self._kthreadd_visible()
        self._nodes: dict[int, tuple[float, frozenset[int] | None]] = {}  # pid -> (read at, minors held)
        self._scopes: dict[int, tuple[float, str | None]] = {}
        self._run_scopes: dict[int, tuple[float, str | None]] = {}
        self._oldest = math.inf  # the oldest read time of the facts consulted since open_verdict

    def open_verdict(self) -> None:
        """Start noting which facts the next calls consult (for ``verdict_until``)."""
        self._oldest = math.inf

    def verdict_until(self) -> float:
        """When the oldest fact consulted since ``open_verdict`` is due to be read again: until then
        the same questions get the same answers (inf: no /proc fact was consulted)."""
        return self._oldest + REFRESH_S

    def holds(self, until: float) -> bool:
        """Whether a verdict good ``until`` (from ``verdict_until``) still holds now."""
        return self._clock() < until

    def _consulted(self, read_at: float) -> None:
        if read_at < self._oldest:
            self._oldest = read_at

    def verified(self, listed: Iterable[int], run_pids: set[int]) -> dict[int, str]:
        """Listed pids that are the run's, with how they were verified."""
        out: dict[int, str] = {}
        run_scope: str | None = None
        scope_known = False
        for pid in listed:
            if pid in run_pids:
                if not self.foreign_ns or self.minors(pid):
                    out[pid] = PROC_PID
                continue
            if self.foreign_ns or not run_pids:
                continue
            if not scope_known:  # the run's processes share one container or job
                run_scope, scope_known = self._run_scope(run_pids), True
            if run_scope is not None and self.scope(pid) == run_scope:
                out[pid] = PROC_CGROUP
        return out

    def _run_scope(self, run_pids: set[int]) -> str | None:
        """The run's container or job scope, from its oldest processes (remembered per root)."""
        root = min(run_pids)
        now = self._clock()
        hit = self._run_scopes.get(root)
        if hit is not None and now - hit[0] < REFRESH_S:
            self._consulted(hit[0])
            return hit[1]
        self._consulted(now)
        value = next((s for s in map(self.scope, sorted(run_pids)[:4]) if s is not None), None)
        self._run_scopes = {root: (now, value)}
        return value

    def holders(self, run_pids: Iterable[int], minor: int | None) -> int | None:
        """How many of the run's processes hold /dev/nvidia<minor> (None: the minor is unknown)."""
        if minor is None:
            return None
        return sum(1 for pid in run_pids if minor in (self.minors(pid) or ()))

    def minors(self, pid: int) -> frozenset[int] | None:
        """GPU minor numbers whose device node ``pid`` holds open (None: unreadable)."""
        now = self._clock()
        hit = self._nodes.get(pid)
        if hit is not None and now - hit[0] < REFRESH_S:
            self._consulted(hit[0])
            return hit[1]
        self._consulted(now)
        held: set[int] | None = set()
        fd_dir = f"{self._proc}/{pid}/fd"
        try:
            for fd in os.listdir(fd_dir):
                try:
                    m = _NVIDIA_NODE.match(os.readlink(f"{fd_dir}/{fd}"))
                except OSError:
                    continue  # closed meanwhile
                if m:
                    held.add(int(m.group(1)))
        except OSError:
            held = None  # gone, or not ours to read
        value = None if held is None else frozenset(held)
        self._nodes[pid] = (now, value)
        if len(self._nodes) > 4096:
            self._nodes = {p: v for p, v in self._nodes.items() if now - v[0] < REFRESH_S}
        return value

    def scope(self, pid: int) -> str | None:
        now = self._clock()
        hit = self._scopes.get(pid)
        if hit is not None and now - hit[0] < REFRESH_S:
            self._consulted(hit[0])
            return hit[1]
        self._consulted(now)
        try:
            with open(f"{self._proc}/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
                value = job_scope(f.read().splitlines())
        except OSError:
            value = None
        self._scopes[pid] = (now, value)
        if len(self._scopes) > 4096:
            self._scopes = {p: v for p, v in self._scopes.items() if now - v[0] < REFRESH_S}
        return value

    def _kthreadd_visible(self) -> bool:
        try:
            with open(f"{self._proc}/2/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            return False
        # "2 (kthreadd) S 0 ..." — comm in parentheses, then state, then the parent pid
        comm_end = stat.rfind(")")
        fields = stat[comm_end + 2 :].split()
        return stat[stat.find("(") + 1 : comm_end] == "kthreadd" and len(fields) > 1 and fields[1] == "0"
