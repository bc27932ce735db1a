"""Several runs on one GPU at once: who used what.

NVML's utilisation and energy are the device's, so every run sharing a GPU records the same busy
time; summing them would bill the GPU twice. The union of the runs' time is cut into segments at
every span and interval edge. Where one run holds the GPU it gets everything. Where several do,
the device's busy time, energy and held time of the segment are split by weights, by the first
rule every holder can support:

1. ``sm``: each run's share of SM utilisation (``GpuInterval.proc_sm_util_avg_pct``, from NVML's
   per-process utilisation samples);
2. ``memory``: each run's GPU memory (``proc_mem_max_b``), when per-process utilisation is
   unsupported (e.g. some vGPU and older drivers) or every run reads 0;
3. ``equal``: otherwise.

The held time is split too, so an hour of a shared GPU is billed once in total. The device's busy
rate in a segment is the mean of what the holders' intervals recorded (they measured the same GPU).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuledger.core.pricing.usage import Segment, alloc_segments

__all__ = ["Reading", "Tenant", "attribute", "overlapping_groups"]


@dataclass(slots=True)
class Reading:
    """One recorded interval of one run on the shared GPU."""

    t0: float
    t1: float
    busy_s: float | None
    energy_j: float | None
    proc_sm_pct: float | None = None
    proc_mem_b: float | None = None


@dataclass
class Tenant:
    run_id: str
    start: float  # held span [start, end)
    end: float
    readings: list[Reading] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.readings.sort(key=lambda r: r.t0)
        self._starts = [r.t0 for r in self.readings]

    def reading_at(self, a: float, b: float) -> Reading | None:
        """The interval covering the segment [a, b) (segments never straddle an interval edge)."""
        i = bisect.bisect_right(self._starts, a) - 1
        if i >= 0:
            r = self.readings[i]
            if r.t0 <= a and b <= r.t1:
                return r
        return None


def overlapping_groups(spans: Sequence[tuple[str, float, float]]) -> list[list[str]]:
    """Run ids whose [start, end) spans on one GPU overlap, as connected groups (only groups of 2+)."""
    groups: list[list[str]] = []
    current: list[str] = []
    reach = float("-inf")
    for run_id, start, end in sorted(spans, key=lambda s: (s[1], s[2])):
        if current and start < reach:
            current.append(run_id)
        else:
            if len(current) > 1:
                groups.append(current)
            current = [run_id]
            reach = float("-inf")
        reach = max(reach, end)
    if len(current) > 1:
        groups.append(current)
    return groups


def _weights(holders: list[Tenant], readings: list[Reading | None]) -> tuple[list[float], str]:
    sm = [r.proc_sm_pct if r is not None else None for r in readings]
    if all(v is not None for v in sm) and sum(sm) > 0:  # type: ignore[arg-type]
        return [float(v) for v in sm], "sm"  # type: ignore[arg-type]
    mem = [r.proc_mem_b if r is not None else None for r in readings]
    if all(v is not None for v in mem) and sum(mem) > 0:  # type: ignore[arg-type]
        return [float(v) for v in mem], "memory"  # type: ignore[arg-type]
    return [1.0] * len(holders), "equal"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def attribute(tenants: Sequence[Tenant]) -> dict[str, list[Segment]]:
    """Each tenant's segments of use, with the shared parts split (module docstring)."""
    points = sorted(
        {p for t in tenants for p in (t.start, t.end)}
        | {p for t in tenants for r in t.readings for p in (r.t0, r.t1) if t.start <= p <= t.end}
    )
    out: dict[str, list[Segment]] = {t.run_id: [] for t in tenants}
    for a, b in itertools.pairwise(points):
        holders = [t for t in tenants if t.start <= a and b <= t.end]
        if not holders:
            continue
        length = b - a
        if len(holders) == 1:
            t = holders[0]
            r = t.reading_at(a, b)
            seg = Segment(a, b, length, None, None)
            if r is not None:
                part = length / (r.t1 - r.t0)
                seg.busy_s = None if r.busy_s is None else r.busy_s * part
                seg.energy_j = None if r.energy_j is None else r.energy_j * part
                seg.intervals = int(b == r.t1)
            out[t.run_id].append(seg)
            continue
        readings = [t.reading_at(a, b) for t in holders]
        busy_rate = _mean([r.busy_s / (r.t1 - r.t0) for r in readings if r is not None and r.busy_s is not None])
        energy_rate = _mean([r.energy_j / (r.t1 - r.t0) for r in readings if r is not None and r.energy_j is not None])
        weights, rule = _weights(holders, readings)
        total = sum(weights)
        for t, r, w in zip(holders, readings, weights, strict=False):
            share = w / total
            out[t.run_id].append(
                Segment(
                    a,
                    b,
                    length * share,
                    None if busy_rate is None else busy_rate * length * share,
                    None if energy_rate is None else energy_rate * length * share,
                    rule,
                    int(r is not None and b == r.t1),
                )
            )
    return out


def solo_segments(tenant: Tenant) -> list[Segment]:
    """A tenant alone on its GPU: its intervals as they are, gaps as held time."""
    return alloc_segments(
        tenant.start,
        tenant.end,
        [Segment(r.t0, r.t1, r.t1 - r.t0, r.busy_s, r.energy_j, None, 1) for r in tenant.readings],
    )
