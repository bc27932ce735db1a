"""Downsampling a run's intervals for charts and diagnosis, keeping peaks and minima.

A 72-hour run of 8 GPUs at 1-second intervals has about 2 million GPU intervals; a chart needs a
few thousand points. Time is cut into buckets of equal width from a common origin (so the buckets
of all GPUs line up), and each bucket keeps, per series:

- the exact re-aggregation of its intervals (integrals summed, peaks maxed), so a
  bucket is itself a valid coarser interval and totals over buckets equal totals over intervals;
- the minimum and maximum *per interval* (min/max envelope, as in M4), so a 1-second spike or a
  1-second drop survives any bucket width.

``bucket_gpu`` / ``bucket_host`` are the pure reference; ``store/series_queries.py`` computes the
same buckets in SQL for big runs (the tests check both agree).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpuledger.core.metering.intervals import merge_gpu_intervals, merge_host_intervals
from gpuledger.core.model import GpuInterval, HostInterval

MAX_POINTS = 2000  # buckets per series: enough for a full-width chart, small enough for 10 MB
# Throttle reasons the collectors record (collect/nvml.py); the SQL downsampler sums these keys.
THROTTLE_REASONS = (
    "power",
    "thermal",
    "sync_boost",
    "board_limit",
    "low_util",
    "reliability",
    "hw_slowdown",
    "hw_power_brake",
)


@dataclass
class GpuBucket:
    """One device's intervals in one time bucket: ``merged`` plus per-interval extremes.

    ``merged`` keeps the sums and peaks of core.metering.intervals' merge rules; the fields the report does
    not use (samples, last values, memory clock, per-process SM share) are left None by the SQL
    twin and so are not relied on.
    """

    key: int  # bucket number from the origin (or the interval seq when not downsampled)
    merged: GpuInterval
    n: int  # intervals in the bucket
    covered_s: float = 0.0  # Σ (t1 - t0): time actually measured in the bucket
    util_min: float | None = None  # busy fraction 0-1 of the least busy interval
    util_max: float | None = None
    mem_min_b: int | None = None  # smallest interval peak of device memory (a drop shows)
    sm_clock_min_mhz: float | None = None  # lowest interval clock (throttling shows)
    throttled: int = 0  # intervals with any throttle reason recorded

    @property
    def util_mean(self) -> float | None:
        """Busy-seconds over measured seconds: exact, whatever the bucket width."""
        if self.merged.busy_s is None or self.covered_s <= 0:
            return None
        return min(1.0, self.merged.busy_s / self.covered_s)


@dataclass
class HostBucket:
    key: int
    merged: HostInterval
    n: int
    covered_s: float = 0.0
    cpu_rate_min: float | None = None  # process-tree CPU in cores (cpu_s per second), per interval
    cpu_rate_max: float | None = None
    rss_min_b: int | None = None


@dataclass
class Plan:
    """How a run is bucketed: ``width_s`` None means one bucket per interval (no downsampling)."""

    origin: float
    width_s: float | None
    raw_intervals: int = 0  # the longest stream's interval count
    extra: dict[str, float] = field(default_factory=dict)

    def key(self, t0: float) -> int:
        assert self.width_s is not None
        # floor(a / b), not a // b: the SQL twin divides then truncates, and the two must agree.
        return max(0, math.floor((t0 - self.origin) / self.width_s))

    def center(self, key: int) -> float:
        assert self.width_s is not None
        return self.origin + (key + 0.5) * self.width_s


def plan(origin: float, end: float, intervals_per_stream: int, max_points: int = MAX_POINTS) -> Plan:
    """Downsample only when a stream has more intervals than ``max_points``."""
    if intervals_per_stream <= max_points or end <= origin:
        return Plan(origin, None, intervals_per_stream)
    return Plan(origin, (end - origin) / max_points * (1 + 1e-9), intervals_per_stream)


def _rate(value: float | None, iv: GpuInterval | HostInterval) -> float | None:
    span = iv.t1 - iv.t0
    if value is None or span <= 0:
        return None
    return value / span


def _lo(values: Iterable[float | int | None]) -> float | int | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _hi(values: Iterable[float | int | None]) -> float | int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _groups(items: Sequence, plan_: Plan, seq_of) -> dict[int, list]:
    groups: dict[int, list] = {}
    for item in sorted(items, key=lambda i: (i.t0, seq_of(i))):
        key = seq_of(item) if plan_.width_s is None else plan_.key(item.t0)
        groups.setdefault(key, []).append(item)
    return groups


def bucket_gpu(intervals: Sequence[GpuInterval], plan_: Plan) -> dict[str, list[GpuBucket]]:
    """Per device uuid, buckets in time order."""
    by_dev: dict[str, list[GpuInterval]] = {}
    for iv in intervals:
        by_dev.setdefault(iv.device_uuid, []).append(iv)
    out: dict[str, list[GpuBucket]] = {}
    for uuid, ivs in sorted(by_dev.items()):
        buckets = []
        for key, part in sorted(_groups(ivs, plan_, lambda i: i.seq).items()):
            utils = [_rate(i.busy_s, i) for i in part]
            buckets.append(
                GpuBucket(
                    key=key,
                    merged=merge_gpu_intervals(part, seq=key),
                    n=len(part),
                    covered_s=math.fsum(i.t1 - i.t0 for i in part),
                    util_min=_clip(_lo(utils)),
                    util_max=_clip(_hi(utils)),
                    mem_min_b=_lo(i.mem_used_max_b for i in part),  # type: ignore[arg-type]
                    sm_clock_min_mhz=_lo(i.sm_clock_avg_mhz for i in part),
                    throttled=sum(1 for i in part if i.throttle_s),
                )
            )
        out[uuid] = buckets
    return out


def bucket_host(intervals: Sequence[HostInterval], plan_: Plan) -> list[HostBucket]:
    out = []
    for key, part in sorted(_groups(intervals, plan_, lambda i: i.seq).items()):
        rates = [_rate(i.cpu_s, i) for i in part]
        out.append(
            HostBucket(
                key=key,
                merged=merge_host_intervals(part, seq=key),
                n=len(part),
                covered_s=math.fsum(i.t1 - i.t0 for i in part),
                cpu_rate_min=_lo(rates),
                cpu_rate_max=_hi(rates),
                rss_min_b=_lo(i.rss_max_b for i in part),  # type: ignore[arg-type]
            )
        )
    return out


def _clip(value: float | int | None) -> float | None:
    """Busy fractions: tick edges can put busy a hair above the span."""
    return None if value is None else min(1.0, max(0.0, float(value)))


def x_of(bucket: GpuBucket | HostBucket, plan_: Plan) -> float:
    """Where a bucket is drawn: the bucket's centre (shared by all devices), or the interval's middle."""
    if plan_.width_s is None:
        return (bucket.merged.t0 + bucket.merged.t1) / 2
    return plan_.center(bucket.key)


def finite(value: float | int | None) -> float | int | None:
    """None for NaN / inf (JSON has no such numbers)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def minmax_points(points: Sequence[tuple[float, float]], buckets: int) -> list[tuple[float, float]]:
    """At most ``2 * buckets`` of (t, value) points, time-ordered: each equal-time bucket keeps its
    lowest and highest point, in the order they happened (M4 without first/last). NaN is skipped."""
    pts = [(t, v) for t, v in points if v == v]
    if len(pts) <= 2 * buckets or buckets <= 0:
        return pts
    t0, t1 = pts[0][0], pts[-1][0]
    width = (t1 - t0) / buckets or 1.0
    groups: dict[int, list[tuple[float, float]]] = {}
    for t, v in pts:
        groups.setdefault(min(buckets - 1, math.floor((t - t0) / width)), []).append((t, v))
    out: list[tuple[float, float]] = []
    for key in sorted(groups):
        group = groups[key]
        lo = min(group, key=lambda p: p[1])
        hi = max(group, key=lambda p: p[1])
        out.extend(sorted({lo, hi}))
    return out
