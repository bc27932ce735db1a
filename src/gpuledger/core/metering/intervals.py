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
from typing import TypeVar

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


def _sum(values: Iterable[N | None]) -> N | None:
    known = [v for v in values if v is not None]
    if not known:
        return None
    if all(isinstance(v, int) for v in known):
        return sum(known)  # exact for byte counts
    return math.fsum(known)  # type: ignore[return-value]


def _max(values: Iterable[N | None]) -> N | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _last(values: Iterable[N | None]) -> N | None:
    """The last known value: a tick that missed a reading does not erase the one before."""
    last = None
    for v in values:
        if v is not None:
            last = v
    return last


def _weighted_mean(pairs: Iterable[tuple[float | None, float]]) -> float | None:
    """Mean of values weighted by span length; a plain mean when every span is zero-length."""
    known = [(v, w) for v, w in pairs if v is not None]
    if not known:
        return None
    total = math.fsum(max(w, 0.0) for _, w in known)
    if total <= 0:
        return math.fsum(v for v, _ in known) / len(known)
    return math.fsum(v * max(w, 0.0) for v, w in known) / total


def merge_methods(methods: Iterable[str | None]) -> str | None:
    """ "samples" + "samples" -> "samples"; "samples" + "instant" -> "instant,samples"."""
    found = {part for m in methods if m for part in m.split(",") if part}
    return ",".join(sorted(found)) if found else None


def _sum_dicts(dicts: Iterable[dict[str, float] | None]) -> dict[str, float] | None:
    """Per-key sums; None only when no part could tell ({} means "measured, nothing")."""
    known = [d for d in dicts if d is not None]
    if not known:
        return None
    keys = sorted({k for d in known for k in d})
    return {k: math.fsum(d[k] for d in known if k in d) for k in keys}


def _span(parts: Sequence[GpuTick | GpuInterval | HostTick | HostInterval]) -> tuple[float, float]:
    if not parts:
        raise ValueError("cannot merge an empty list")
    return parts[0].t0, parts[-1].t1


# -- GPU ----------------------------------------------------------------------------------------


def merge_gpu_ticks(uuid: str, seq: int, ticks: Sequence[GpuTick]) -> GpuInterval:
    """One device's ticks (in time order) -> one interval."""
    t0, t1 = _span(ticks)
    if any(t.uuid != uuid for t in ticks):
        raise ValueError(f"ticks of other devices in an interval of {uuid}")
    weights = [t.t1 - t.t0 for t in ticks]
    return GpuInterval(
        device_uuid=uuid,
        seq=seq,
        t0=t0,
        t1=t1,
        samples=len(ticks),
        busy_s=_sum(t.busy_s for t in ticks),
        util_method=merge_methods(t.util_method for t in ticks),
        util_max_pct=_max(t.util_max_pct for t in ticks),
        util_idle_s=_sum(t.util_idle_s for t in ticks),
        util_unknown_s=_sum(t.util_unknown_s for t in ticks),
        energy_j=_sum(t.energy_j for t in ticks),
        energy_method=merge_methods(t.energy_method for t in ticks),
        power_max_w=_max(t.power_w for t in ticks),
        mem_used_max_b=_max(t.mem_used_b for t in ticks),
        mem_used_last_b=_last(t.mem_used_b for t in ticks),
        mem_reserved_b=_last(t.mem_reserved_b for t in ticks),
        proc_mem_max_b=_max(t.proc_mem_b for t in ticks),
        proc_method=merge_methods(t.proc_method for t in ticks),
        proc_sm_util_avg_pct=_weighted_mean(zip((t.proc_sm_util_pct for t in ticks), weights, strict=True)),
        temp_max_c=_max(t.temp_c for t in ticks),
        sm_clock_avg_mhz=_weighted_mean(zip((t.sm_clock_mhz for t in ticks), weights, strict=True)),
        mem_clock_max_mhz=_max(t.mem_clock_mhz for t in ticks),
        throttle_s=_sum_dicts(t.throttle_s for t in ticks),
    )


def merge_gpu_intervals(intervals: Sequence[GpuInterval], seq: int = 0) -> GpuInterval:
    """One device's intervals (in time order) -> one coarser interval (samples add up)."""
    t0, t1 = _span(intervals)
    uuid = intervals[0].device_uuid
    if any(i.device_uuid != uuid for i in intervals):
        raise ValueError(f"intervals of other devices merged with {uuid}")
    weights = [i.t1 - i.t0 for i in intervals]
    return GpuInterval(
        device_uuid=uuid,
        seq=seq,
        t0=t0,
        t1=t1,
        samples=sum(i.samples for i in intervals),
        busy_s=_sum(i.busy_s for i in intervals),
        util_method=merge_methods(i.util_method for i in intervals),
        util_max_pct=_max(i.util_max_pct for i in intervals),
        util_idle_s=_sum(i.util_idle_s for i in intervals),
        util_unknown_s=_sum(i.util_unknown_s for i in intervals),
        energy_j=_sum(i.energy_j for i in intervals),
        energy_method=merge_methods(i.energy_method for i in intervals),
        power_max_w=_max(i.power_max_w for i in intervals),
        mem_used_max_b=_max(i.mem_used_max_b for i in intervals),
        mem_used_last_b=_last(i.mem_used_last_b for i in intervals),
        mem_reserved_b=_last(i.mem_reserved_b for i in intervals),
        proc_mem_max_b=_max(i.proc_mem_max_b for i in intervals),
        proc_method=merge_methods(i.proc_method for i in intervals),
        proc_sm_util_avg_pct=_weighted_mean(zip((i.proc_sm_util_avg_pct for i in intervals), weights, strict=True)),
        temp_max_c=_max(i.temp_max_c for i in intervals),
        sm_clock_avg_mhz=_weighted_mean(zip((i.sm_clock_avg_mhz for i in intervals), weights, strict=True)),
        mem_clock_max_mhz=_max(i.mem_clock_max_mhz for i in intervals),
        throttle_s=_sum_dicts(i.throttle_s for i in intervals),
    )


# -- host ---------------------------------------------------------------------------------------


def merge_host_ticks(seq: int, ticks: Sequence[HostTick]) -> HostInterval:
    """Host ticks (in time order) -> one interval.

    A tick's host-wide utilisation is weighted by the span it really covers, (sys_t0, t1], which is
    longer than the tick when the host-wide counters were read a few ticks apart.
    """
    t0, t1 = _span(ticks)
    weights = [t.t1 - (t.t0 if t.sys_t0 is None else t.sys_t0) for t in ticks]
    return HostInterval(
        seq=seq,
        t0=t0,
        t1=t1,
        samples=len(ticks),
        cpu_s=math.fsum(t.cpu_s for t in ticks),
        rss_max_b=max(t.rss_b for t in ticks),
        read_b=sum(t.read_b for t in ticks),
        write_b=sum(t.write_b for t in ticks),
        threads_max=max(t.threads for t in ticks),
        procs_max=max(t.procs for t in ticks),
        sys_cpu_util_avg_pct=_weighted_mean(zip((t.sys_cpu_util_pct for t in ticks), weights, strict=True)),
        iowait_s=_sum(t.iowait_s for t in ticks),
        sys_mem_used_max_b=_max(t.sys_mem_used_b for t in ticks),
        disk_read_b=_sum(t.disk_read_b for t in ticks),
        disk_write_b=_sum(t.disk_write_b for t in ticks),
        net_rx_b=_sum(t.net_rx_b for t in ticks),
        net_tx_b=_sum(t.net_tx_b for t in ticks),
    )


def merge_host_intervals(intervals: Sequence[HostInterval], seq: int = 0) -> HostInterval:
    """Host intervals (in time order) -> one coarser interval."""
    t0, t1 = _span(intervals)
    weights = [i.t1 - i.t0 for i in intervals]
    return HostInterval(
        seq=seq,
        t0=t0,
        t1=t1,
        samples=sum(i.samples for i in intervals),
        cpu_s=math.fsum(i.cpu_s for i in intervals),
        rss_max_b=max(i.rss_max_b for i in intervals),
        read_b=sum(i.read_b for i in intervals),
        write_b=sum(i.write_b for i in intervals),
        threads_max=max(i.threads_max for i in intervals),
        procs_max=max(i.procs_max for i in intervals),
        sys_cpu_util_avg_pct=_weighted_mean(zip((i.sys_cpu_util_avg_pct for i in intervals), weights, strict=True)),
        iowait_s=_sum(i.iowait_s for i in intervals),
        sys_mem_used_max_b=_max(i.sys_mem_used_max_b for i in intervals),
        disk_read_b=_sum(i.disk_read_b for i in intervals),
        disk_write_b=_sum(i.disk_write_b for i in intervals),
        net_rx_b=_sum(i.net_rx_b for i in intervals),
        net_tx_b=_sum(i.net_tx_b for i in intervals),
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
