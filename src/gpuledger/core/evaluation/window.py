"""GPU usage over an evaluation's window, from the run's intervals.

Each interval's integrals (energy, busy time) are counted in the share of its length that lies
in the window: whole for the intervals inside it, in proportion to time for the two at its edges.
``gpuledger run`` closes an interval where an evaluation starts and ends (a ``phase`` message),
so those edge shares are slivers of a few milliseconds. A figure is None (not measured) when an
overlapping interval lacks it or the intervals do not cover the window: never a partial sum.

Busy time is not placed on the clock as exactly as energy. A utilisation sample describes the
sample period (1/6 s to 1 s) before its timestamp and is read after it, so the time between an
interval's end and the newest sample read there is left to the next interval (docs/METERING.md):
at each edge of the window up to one period of busy time lands on the other side. The window's
busy time is therefore off by up to one sample period, its share by up to period / window. A
window shorter than ``MIN_BUSY_WINDOW_S`` (a ``yolo val`` of a few images lasts tens of
milliseconds, less than one period) has no busy figure: None, never a share that only says
where the samples happened to fall. Time no reading measured (unmeasured) is neither busy nor
idle: the share is over the window's measured GPU time, as every other screen reads it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuledger.core.metering.busy import unmeasured_seconds
from gpuledger.core.model import GpuInterval

COVERAGE = 0.99  # share of the window each GPU's intervals must cover for its integrals to count
# The shortest window with a busy figure: its share is then off by at most one sample period's
# share of it (module doc), 1/6 of the window at NVML's shortest documented period.
MIN_BUSY_WINDOW_S = 1.0


@dataclass(frozen=True)
class WindowUsage:
    seconds: float
    gpus: int  # GPUs with intervals in the window
    energy_j: float | None
    busy_s: float | None  # summed over the GPUs; None for a window too short to place it (module doc)
    power_peak_w: float | None  # the highest power one GPU reached
    unmeasured_s: float = 0.0  # GPU time in the window no reading measured, summed over the GPUs

    @property
    def power_mean_w(self) -> float | None:
        """Mean power of all the run's GPUs together over the window."""
        if self.energy_j is None or self.seconds <= 0:
            return None
        return self.energy_j / self.seconds

    @property
    def busy_share(self) -> float | None:
        """Busy GPU time / the window's measured GPU time (window × GPUs − unmeasured), 0..1."""
        measured = self.seconds * self.gpus - self.unmeasured_s
        if self.busy_s is None or measured <= 0:
            return None
        return min(1.0, self.busy_s / measured)

    def per_image_j(self, images: int | None) -> float | None:
        if self.energy_j is None or not images:
            return None
        return self.energy_j / images


def window_usage(intervals: Iterable[GpuInterval], t0: float, t1: float) -> WindowUsage:
    seconds = max(0.0, t1 - t0)
    energy: dict[str, float | None] = {}
    busy: dict[str, float | None] = {}
    covered: dict[str, float] = {}
    unmeasured = 0.0
    peak: float | None = None
    for iv in intervals:
        length = iv.t1 - iv.t0
        overlap = min(iv.t1, t1) - max(iv.t0, t0)
        if length <= 0 or overlap <= 0:
            continue
        share = overlap / length
        dev = iv.device_uuid
        covered[dev] = covered.get(dev, 0.0) + overlap
        unmeasured += min(unmeasured_seconds(iv), length) * share
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

    busy_s = total(busy) if seconds >= MIN_BUSY_WINDOW_S else None
    return WindowUsage(seconds, len(covered), total(energy), busy_s, peak, unmeasured)
