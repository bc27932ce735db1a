"""Which of a GPU's processes are the run's, and what they hold: a pure function of the facts.

NVML lists every process on a GPU by the pid the *host* kernel gave it (the driver does not know
PID namespaces; on some recent drivers the compute list is translated into the caller's
namespace while the per-process utilisation samples are not). The collector gathers the facts
— which listed pids it verified as the run's own and how, whether it runs in a foreign PID
namespace, how many of the run's processes hold the GPU's device node — and this module decides:

1. Verified pids (``pid``: the run's own process; ``cgroup``: a process of the run's container or
   Slurm job that is outside its process tree, e.g. an ``srun`` step) are the run's.
2. No process on the GPU at all: the run holds 0 bytes there (NVML lists every process).
3. In a foreign PID namespace, when no listed pid can be verified: if the GPU lists no more
   processes than the run has processes holding the GPU's device node, they are all the run's
   (``pidns``). Otherwise the run's share cannot be told: None, and the caller says why.
4. Same namespace, none verified: the GPU is used by others only; the run holds 0 bytes.

Memory NVML cannot tell (``usedGpuMemory`` None: MIG, some containers) stays None: a sum with an
unknown part is unknown, never a measured zero. Per-process utilisation samples older than the
cursor (returned again by some drivers) or above 100 % (seen in the field) are dropped.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import NamedTuple

PROC_PID = "pid"
PROC_CGROUP = "cgroup"
PROC_PIDNS = "pidns"


class ProcMatch(NamedTuple):  # a NamedTuple: made for every GPU at every tick, so cheap to build
    mem_b: int | None  # memory the run's processes hold on the GPU; None: cannot tell
    pids: frozenset[int]  # listed pids taken as the run's (for the utilisation samples)
    method: str | None  # how: "pid", "cgroup", "pidns" (comma-joined when mixed); None: cannot tell
    all_ours: bool  # every process on the GPU is the run's
    reason: str | None = None  # why the run's share cannot be told


def attribute(
    procs: Mapping[int, int | None],
    verified: Mapping[int, str],
    *,
    foreign_ns: bool,
    holders: int | None,
) -> ProcMatch:
    """The run's share of a GPU's processes ``procs`` (pid -> usedGpuMemory), by the rules above."""
    if verified:
        mine: list[int] = []
        total: int | None = 0
        for pid, mem in procs.items():
            if pid in verified:
                mine.append(pid)
                if total is not None:
                    total = None if mem is None else total + int(mem)
        if mine:
            found = set(verified.values())
            methods = found.pop() if len(found) == 1 else ",".join(sorted(found))
            return ProcMatch(total, frozenset(mine), methods, len(mine) == len(procs))
    if not procs:
        return ProcMatch(0, frozenset(), PROC_PID, False)
    if not foreign_ns:
        return ProcMatch(0, frozenset(), PROC_PID, False)
    if holders is not None and 0 < len(procs) <= holders:
        return ProcMatch(_total(procs.values()), frozenset(procs), PROC_PIDNS, True)
    why = (
        f"NVML lists {len(procs)} process(es) on this GPU by host pid and this run is in another PID "
        f"namespace; {holders or 0} of the run's processes hold the GPU, so its share cannot be told"
    )
    return ProcMatch(None, frozenset(), None, False, why)


class ProcSample(NamedTuple):
    """One per-process utilisation sample, with the member names of NVML's
    ``nvmlProcessUtilizationSample_t`` (the driver's own samples are passed as they come)."""

    pid: int
    timeStamp: int  # NVML's member names
    smUtil: float


def sm_share(
    samples: Iterable[ProcSample],
    match: ProcMatch,
    cursor_us: int,
    *,
    listed: Collection[int] = frozenset(),
    foreign_ns: bool = False,
) -> tuple[float | None, int]:
    """The run's SM utilisation (0-100) from per-process samples (``pid``, ``timeStamp`` µs, ``smUtil`` %).

    Returns (share or None, the newest timestamp seen: the next cursor). When every process on
    the GPU is the run's, every sample is, whatever pid it carries (drivers that translate the
    process list but not the samples). In a foreign PID namespace, samples whose pids are none of
    the ``listed`` ones are in another pid space: the run's share of them cannot be told.
    """
    newest = cursor_us
    every, mine = match.all_ours, match.pids
    fresh = in_listed = False
    sums: dict[int, list[float]] = {}
    for s in samples:  # one pass: this runs for every GPU at every tick
        pid, ts, sm = s.pid, s.timeStamp, s.smUtil
        if ts <= cursor_us or not 0 <= sm <= 100:
            continue  # stale (already counted) or impossible
        if ts > newest:
            newest = ts
        fresh = True
        if foreign_ns and not in_listed and pid in listed:
            in_listed = True
        if every or pid in mine:
            acc = sums.get(pid)
            if acc is None:
                sums[pid] = [sm, 1]
            else:
                acc[0] += sm
                acc[1] += 1
    if match.method is None:
        return None, newest
    if foreign_ns and not every and fresh and not in_listed:
        return None, newest
    share = 0.0
    for total, n in sums.values():
        share += total / n
    return (share if share < 100.0 else 100.0), newest


def _total(values: Iterable[int | None]) -> int | None:
    total = 0
    for v in values:
        if v is None:
            return None
        total += int(v)
    return total
