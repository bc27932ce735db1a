"""Ticks -> recording intervals, and intervals -> coarser intervals.

A collector reports what happened between two reads (a tick, e.g. 1 s); the recorder stores one
row per recording interval (e.g. 5 s). The merge rules (docs/ARCHITECTURE.md, principles 2 and 3):

- integrals (busy_s, energy_j, throttle_s per reason, cpu_s, bytes, iowait_s) are summed, so any
  regrouping of the same ticks gives the same totals;
- a field absent (None) in every part stays None; when only some parts have it, the known
  parts are summed (an interval with energy for 3 of its 5 ticks reports those 3 ticks' energy:
  the part we measured, never an invented value for the rest);
- gauges keep their max (peaks), their last known value (memory now), or a time-weighted mean
  (clocks, utilisation %), each over the parts that have them;
- util_method / energy_method: the single method, else the sorted set comma-joined
  ("instant,samples"), so a mixed interval says so;
- t0 is the first part's t0, t1 the last part's t1; parts are given in time order.

``merge_*_ticks`` build an interval from ticks; ``merge_*_intervals`` re-aggregate intervals
(rollups, the run summary) with the same rules. The builders decide where intervals end.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from functools import partial
from operator import attrgetter, is_not, itemgetter, mul, sub
from typing import TypeVar

from gpuledger.core.metering.busy import unmeasured_seconds
from gpuledger.core.model import GpuInterval, GpuTick, HostInterval, HostTick

__all__ = [
    "GpuIntervalBuilder",
    "HostIntervalBuilder",
    "merge_gpu_intervals",
    "merge_gpu_ticks",
    "merge_host_intervals",
    "merge_host_ticks",
    "merge_methods",
]

N = TypeVar("N", int, float)


# -- field rules --------------------------------------------------------------------------------
# Each takes one column (a sequence of the parts' values). Interval closes run for every device
# at every interval, and summaries over thousands of intervals, so the rules work on whole
# columns in C (filter, map, fsum) rather than with a Python loop per part. fsum is exact
# whatever the order, so the results are the same as adding part by part.

_known = partial(is_not, None)
_is_int = int.__instancecheck__  # isinstance(v, int), callable from map


def _sum(values: Sequence[N | None]) -> N | None:
    known = list(filter(_known, values))
    if not known:
        return None
    if all(map(_is_int, known)):
        return sum(known)  # exact for byte counts
    return math.fsum(known)  # type: ignore[return-value]


def _max(values: Sequence[N | None]) -> N | None:
    return max(filter(_known, values), default=None)


def _last(values: Sequence[N | None]) -> N | None:
    """The last known value: a tick that missed a reading does not erase the one before."""
    return next(filter(_known, reversed(values)), None)


def _weighted_mean(values: Sequence[float | None], weights: Sequence[float]) -> float | None:
    """Mean of values weighted by span length; a plain mean when every span is zero-length."""
    if None in values:
        known = [(v, w) for v, w in zip(values, weights, strict=True) if v is not None]
        if not known:
            return None
        values, weights = zip(*known, strict=True)
    elif not values:
        return None
    clipped = [w if w > 0.0 else 0.0 for w in weights]  # not map(max, ...): max() is a dear call in 3.11
    total = math.fsum(clipped)
    if total <= 0:
        return math.fsum(values) / len(values)  # type: ignore[arg-type]
    return math.fsum(map(mul, values, clipped)) / total


def merge_methods(methods: Iterable[str | None]) -> str | None:
    """ "samples" + "samples" -> "samples"; "samples" + "instant" -> "instant,samples"."""
    found = set(",".join(filter(None, methods)).split(","))
    found.discard("")
    return ",".join(sorted(found)) if found else None


def _sum_dicts(dicts: Sequence[dict[str, float] | None]) -> dict[str, float] | None:
    """Per-key sums; None only when no part could tell ({} means "measured, nothing")."""
    known = list(filter(_known, dicts))
    if not known:
        return None
    keys = known[0].keys()
    if all(map(keys.__eq__, map(dict.keys, known))):  # the usual case: the same reasons in every part
        return {k: math.fsum(map(itemgetter(k), known)) for k in sorted(keys)}
    every = sorted({k for d in known for k in d})
    return {k: math.fsum(d[k] for d in known if k in d) for k in every}


def _span(parts: Sequence[GpuTick | GpuInterval | HostTick | HostInterval]) -> tuple[float, float]:
    if not parts:
        raise ValueError("cannot merge an empty list")
    return parts[0].t0, parts[-1].t1


# -- GPU ----------------------------------------------------------------------------------------

# The columns a GPU merge reads, in one order for ticks and intervals (a tick's memory reading is
# both the peak and the last value of its interval).
_TICK_COLUMNS = attrgetter(
    "uuid", "t0", "t1", "busy_s", "util_method", "util_max_pct", "util_idle_s", "util_unknown_s", "energy_j",
    "energy_method", "power_w", "mem_used_b", "mem_used_b", "mem_reserved_b", "proc_mem_b", "proc_method",
    "proc_sm_util_pct", "temp_c", "sm_clock_mhz", "mem_clock_mhz", "throttle_s",
)  # fmt: skip
_INTERVAL_COLUMNS = attrgetter(
    "device_uuid", "t0", "t1", "busy_s", "util_method", "util_max_pct", "util_idle_s", "util_unknown_s", "energy_j",
    "energy_method", "power_max_w", "mem_used_max_b", "mem_used_last_b", "mem_reserved_b", "proc_mem_max_b",
    "proc_method", "proc_sm_util_avg_pct", "temp_max_c", "sm_clock_avg_mhz", "mem_clock_max_mhz", "throttle_s",
)  # fmt: skip


def merge_gpu_ticks(uuid: str, seq: int, ticks: Sequence[GpuTick]) -> GpuInterval:
    """One device's ticks (in time order) -> one interval."""
    return _merge_gpu(uuid, seq, ticks, _TICK_COLUMNS, len(ticks), f"ticks of other devices in an interval of {uuid}")


def merge_gpu_intervals(intervals: Sequence[GpuInterval], seq: int = 0) -> GpuInterval:
    """One device's intervals (in time order) -> one coarser interval (samples add up)."""
    uuid = intervals[0].device_uuid if intervals else ""
    mixed = f"intervals of other devices merged with {uuid}"
    return _merge_gpu(uuid, seq, intervals, _INTERVAL_COLUMNS, sum(i.samples for i in intervals), mixed)


def _merge_gpu(
    uuid: str, seq: int, parts: Sequence[GpuTick | GpuInterval], columns: attrgetter, samples: int, mixed: str
) -> GpuInterval:
    t0, t1 = _span(parts)
    (uuids, t0s, t1s, busy, util_method, util_max, idle, unknown, energy, energy_method, power_max, mem_max,
     mem_last, reserved, proc_mem, proc_method, proc_sm, temp, sm_clock, mem_clock,
     throttle) = zip(*map(columns, parts), strict=True)  # fmt: skip
    if uuids.count(uuid) != len(uuids):
        raise ValueError(mixed)
    weights = list(map(sub, t1s, t0s))
    unknown_s = _sum(unknown)
    return GpuInterval(
        device_uuid=uuid,
        seq=seq,
        t0=t0,
        t1=t1,
        samples=samples,
        busy_s=_sum(busy),
        util_method=merge_methods(util_method),
        util_max_pct=_max(util_max),
        util_idle_s=_sum(idle),
        util_unknown_s=unknown_s,
        util_unmeasured_s=_unmeasured(parts, unknown_s),
        energy_j=_sum(energy),
        energy_method=merge_methods(energy_method),
        power_max_w=_max(power_max),
        mem_used_max_b=_max(mem_max),
        mem_used_last_b=_last(mem_last),
        mem_reserved_b=_last(reserved),
        proc_mem_max_b=_max(proc_mem),
        proc_method=merge_methods(proc_method),
        proc_sm_util_avg_pct=_weighted_mean(proc_sm, weights),
        temp_max_c=_max(temp),
        sm_clock_avg_mhz=_weighted_mean(sm_clock, weights),
        mem_clock_max_mhz=_max(mem_clock),
        throttle_s=_sum_dicts(throttle),
    )


def _unmeasured(parts: Sequence[GpuTick | GpuInterval], unknown_s: float | None) -> float | None:
    """The parts' unmeasured time, summed part by part: once parts that did and did not use the
    instant reading are merged, the merged method and unknown time can no longer tell it."""
    if unknown_s is None:
        return None  # no part says how its busy time was covered
    if not unknown_s:
        return 0.0  # the usual case: the samples covered every part
    return math.fsum(map(unmeasured_seconds, parts))


# -- host ---------------------------------------------------------------------------------------


_HOST_TICK_COLUMNS = attrgetter(
    "cpu_s", "rss_b", "read_b", "write_b", "threads", "procs", "sys_cpu_util_pct", "iowait_s", "sys_mem_used_b",
    "disk_read_b", "disk_write_b", "net_rx_b", "net_tx_b",
)  # fmt: skip
_HOST_INTERVAL_COLUMNS = attrgetter(
    "cpu_s", "rss_max_b", "read_b", "write_b", "threads_max", "procs_max", "sys_cpu_util_avg_pct", "iowait_s",
    "sys_mem_used_max_b", "disk_read_b", "disk_write_b", "net_rx_b", "net_tx_b",
)  # fmt: skip


def merge_host_ticks(seq: int, ticks: Sequence[HostTick]) -> HostInterval:
    """Host ticks (in time order) -> one interval.

    A tick's host-wide utilisation is weighted by the span it really covers, (sys_t0, t1], which is
    longer than the tick when the host-wide counters were read a few ticks apart.
    """
    weights = [t.t1 - (t.t0 if t.sys_t0 is None else t.sys_t0) for t in ticks]
    return _merge_host(seq, ticks, _HOST_TICK_COLUMNS, len(ticks), weights)


def merge_host_intervals(intervals: Sequence[HostInterval], seq: int = 0) -> HostInterval:
    """Host intervals (in time order) -> one coarser interval."""
    weights = [i.t1 - i.t0 for i in intervals]
    return _merge_host(seq, intervals, _HOST_INTERVAL_COLUMNS, sum(i.samples for i in intervals), weights)


def _merge_host(
    seq: int, parts: Sequence[HostTick | HostInterval], columns: attrgetter, samples: int, weights: list[float]
) -> HostInterval:
    t0, t1 = _span(parts)
    (cpu, rss, read, write, threads, procs, sys_cpu, iowait, sys_mem, disk_read, disk_write, net_rx,
     net_tx) = zip(*map(columns, parts), strict=True)  # fmt: skip
    return HostInterval(
        seq=seq,
        t0=t0,
        t1=t1,
        samples=samples,
        cpu_s=math.fsum(cpu),
        rss_max_b=max(rss),
        read_b=sum(read),
        write_b=sum(write),
        threads_max=max(threads),
        procs_max=max(procs),
        sys_cpu_util_avg_pct=_weighted_mean(sys_cpu, weights),
        iowait_s=_sum(iowait),
        sys_mem_used_max_b=_max(sys_mem),
        disk_read_b=_sum(disk_read),
        disk_write_b=_sum(disk_write),
        net_rx_b=_sum(net_rx),
        net_tx_b=_sum(net_tx),
    )


# -- grouping -----------------------------------------------------------------------------------


class _Group:
    """Where one stream of ticks is cut into intervals.

    An interval ends at the tick that brings it nearest to ``interval_s`` (it ends when stopping
    now undershoots by less than the next tick would likely overshoot), so 1 s ticks with jitter
    give 5-tick intervals rather than alternating 5 and 6. A gap in the ticks (a collector that
    missed reads) also ends the interval, so an interval never spans time nobody measured.
    """

    def __init__(self, interval_s: float, gap_s: float) -> None:
        self.interval_s = interval_s
        self.gap_s = gap_s
        self.ticks: list = []
        self.seq = 0

    def breaks_before(self, t0: float) -> bool:
        return bool(self.ticks) and t0 - self.ticks[-1].t1 > self.gap_s

    def full(self) -> bool:
        first, last = self.ticks[0], self.ticks[-1]
        return last.t1 - first.t0 + (last.t1 - last.t0) / 2 >= self.interval_s

    def take(self) -> tuple[int, list]:
        seq, ticks = self.seq, self.ticks
        self.seq += 1
        self.ticks = []
        return seq, ticks


def _check_interval(interval_s: float, gap_s: float | None) -> float:
    if not interval_s > 0:
        raise ValueError("interval_s must be positive")
    return interval_s / 2 if gap_s is None else gap_s


class GpuIntervalBuilder:
    """Groups a run's GPU ticks into intervals of about ``interval_s``, per device, with seq 0, 1, 2 ..."""

    def __init__(self, interval_s: float = 5.0, gap_s: float | None = None, first_seq: int = 0) -> None:
        self._interval_s = interval_s
        self._gap_s = _check_interval(interval_s, gap_s)
        self._first_seq = first_seq
        self._groups: dict[str, _Group] = {}

    def add(self, tick: GpuTick) -> list[GpuInterval]:
        """Add one tick; returns the intervals it completed (usually none or one)."""
        group = self._groups.get(tick.uuid)
        if group is None:
            group = self._groups[tick.uuid] = _Group(self._interval_s, self._gap_s)
            group.seq = self._first_seq
        done = [self._close(tick.uuid, group)] if group.breaks_before(tick.t0) else []
        group.ticks.append(tick)
        if group.full():
            done.append(self._close(tick.uuid, group))
        return done

    def flush(self) -> list[GpuInterval]:
        """Close every open interval (end of run), in device order of first appearance."""
        return [self._close(uuid, g) for uuid, g in self._groups.items() if g.ticks]

    @staticmethod
    def _close(uuid: str, group: _Group) -> GpuInterval:
        seq, ticks = group.take()
        return merge_gpu_ticks(uuid, seq, ticks)


class HostIntervalBuilder:
    """Groups a run's host ticks into intervals of about ``interval_s`` with seq 0, 1, 2 ..."""

    def __init__(self, interval_s: float = 5.0, gap_s: float | None = None, first_seq: int = 0) -> None:
        self._group = _Group(interval_s, _check_interval(interval_s, gap_s))
        self._group.seq = first_seq

    def add(self, tick: HostTick) -> list[HostInterval]:
        """Add one tick; returns the intervals it completed (usually none or one)."""
        done = [self._close()] if self._group.breaks_before(tick.t0) else []
        self._group.ticks.append(tick)
        if self._group.full():
            done.append(self._close())
        return done

    def flush(self) -> list[HostInterval]:
        return [self._close()] if self._group.ticks else []

    def _close(self) -> HostInterval:
        seq, ticks = self._group.take()
        return merge_host_ticks(seq, ticks)
