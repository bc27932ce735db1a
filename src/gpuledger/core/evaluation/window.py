"""GPU usage over an evaluation's window, from the run's intervals.

Each interval's integrals (energy, busy time) are counted in the share of its length that lies
in the window: whole for the intervals inside it, in proportion to time for the two at its edges.
``gpuledger run`` closes an interval where an evaluation starts and ends (a ``phase`` message),
so those edge shares are slivers of a few milliseconds. A figure is None (not measured) when an
overlapping interval lacks it or the intervals do not cover the window: never a partial sum.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuledger.core.model import GpuInterval

COVERAGE = 0.99  # share of the window each GPU's intervals must cover for its integrals to count


@dataclass(frozen=True)
class WindowUsage:
    seconds: float
    gpus: int  # GPUs with intervals in the window
    energy_j: float | None
    busy_s: float | None  # summed over the GPUs
    power_peak_w: float | None  # the highest power one GPU reached

    @property
    def power_mean_w(self) -> float | None:
        """Mean power of all the run's GPUs together over the window."""
        if self.energy_j is None or self.seconds <= 0:
            return None
        return self.energy_j / self.seconds

    @property
    def busy_share(self) -> float | None:
        """Busy GPU time / (window × GPUs), 0..1."""
        if self.busy_s is None or self.seconds <= 0 or not self.gpus:
            return None
        return min(1.0, self.busy_s / (self.seconds * self.gpus))

    def per_image_j(self, images: int | None) -> float | None:
        if self.energy_j is None or not images:
            return None
        return self.energy_j / images


def window_usage(intervals: Iterable[GpuInterval], t0: float, t1: float) -> WindowUsage:
    seconds = max(0.0, t1 - t0)
    energy: dict[str, float | None] = {}
    busy: dict[str, float | None] = {}
    covered: dict[str, float] = {}
    peak: float | None = None
    for iv in intervals:
        length = iv.t1 - iv.t0
        overlap = min(iv.t1, t1) - max(iv.t0, t0)
        if length <= 0 or overlap <= 0:
            continue
        share = overlap / length
        dev = iv.device_uuid
        covered[dev] = covered.get(dev, 0.0) + overlap
        for totals, value in ((energy, iv.energy_j), (busy, iv.busy_s)):
            if dev in totals and totals[dev] is None:
                continue
            totals[dev] = None if value is None else (totals.get(dev) or 0.0) + value * share
        if iv.power_max_w is not None:
            peak = iv.power_max_w if peak is None else max(peak, iv.power_max_w)
    complete = bool(covered) and all(c >= COVERAGE * seconds for c in covered.values())

    def total(per_gpu: dict[str, float | None]) -> float | None:
        if not complete or any(v is None for v in per_gpu.values()):
            return None
        return sum(v for v in per_gpu.values() if v is not None)

    return WindowUsage(seconds, len(covered), total(energy), total(busy), peak)
