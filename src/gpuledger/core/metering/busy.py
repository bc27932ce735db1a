"""GPU busy time from NVML's utilisation samples, right for any sampling behaviour.

What a sample is (NVML API reference, ``nvmlDeviceGetSamples`` / ``nvmlDeviceGetUtilizationRates``):
the percent of time over the past *sample period* during which one or more kernels ran on the
GPU. The period is 1/6 s to 1 s depending on the product. So a sample at ``ts`` describes at most
``(ts - period, ts]`` — not the whole span since the previous sample: the driver samples less
often, or stops, while the GPU is idle, and samples can be lost (a full ring buffer, a stalled
reader, a wall-clock step).

The rule (``busy_from_samples``):

* sample ``i`` covers ``(max(ts_i - P, ts_{i-1}), ts_i]`` at its value, ``P`` the sample period;
  so consecutive reads tile time without overlap and a tick's busy time never exceeds the time
  its samples span (at most one period carried across the tick's start);
* the rest of a gap between two samples is *unsampled*: **idle** when the driver stopped
  sampling (nothing was lost: the GPU had nothing to sample), **unknown** when samples may have
  been lost (the caller says so: full buffer, stalled reader, clock step, first read). Unknown
  time is never charged as busy here; the collector measures it another way (the instant
  reading) or records it as unmeasured.

``SamplePeriod`` learns ``P`` from the spacing of consecutive samples, because NVML does not
report it. Pure functions, no I/O, no clock (core/ is where correctness lives: docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol

from gpuledger.core.model import UTIL_INSTANT

_US = 1_000_000
# NVML documents sample periods "between 1 second and 1/6 second depending on the product".
PERIOD_MIN_S = 1 / 6
PERIOD_MAX_S = 1.0
# A learned period is widened by this much: sample timestamps jitter by a few ms, and a period
# taken too short would under-count the first sample after every idle span.
_JITTER = 1.1
_CLUSTER = 1.5  # spacings up to this multiple of the smallest one are "regular" sampling
_HISTORY = 32  # spacings remembered across reads
# A longer spacing between two busy samples is no sample period: the driver stopped sampling in
# between (a burst's last sample and the next burst's first are both above zero).
_SPACING_MAX_US = PERIOD_MAX_S * _JITTER * _US
# The most a tick's figures reach back before its start: one (learned, widened) sample period.
CARRY_MAX_S = PERIOD_MAX_S * _JITTER


class SampleBusy(NamedTuple):  # a NamedTuple: made for every GPU at every tick, so cheap to build
    """What one batch of samples says about the span from the cursor to its newest sample."""

    busy_s: float  # Σ value × covered time, in seconds
    sampled_s: float  # time covered by samples
    idle_s: float  # unsampled time taken as idle: the driver had nothing to sample
    unknown_s: float  # unsampled time where samples may be lost: not measured here
    max_pct: float | None  # the highest sample value (None: no sample)
    last_us: int | None  # timestamp of the newest sample (the next cursor); None: no sample
    # The smallest spacing between consecutive samples of the batch that is at most one period
    # (inf: none): whether SamplePeriod.observe could learn anything from the batch.
    least_gap_us: float = math.inf


def busy_from_samples(
    samples: Sequence[tuple[int, float]],
    cursor_us: int | None,
    period_s: float,
    *,
    first_gap_unknown: bool = False,
) -> SampleBusy:
    """Busy time from ``samples`` (``(timestamp_us, percent)`` sorted by time, all newer than the cursor).

    ``cursor_us`` is the newest sample of the previous batch (None: no previous sample is known,
    so the first sample covers one period and nothing before it is classified). The gap between
    the cursor and the first sample is unknown when ``first_gap_unknown`` (samples may have been
    lost there), else idle; gaps between samples of one batch are idle (the driver's buffer holds
    every sample it took, in order). Percentages outside 0-100 are clamped.
    """
    if not samples:
        return SampleBusy(0.0, 0.0, 0.0, 0.0, None, None)
    period_us = period_s * _US
    # The first sample: its gap to the cursor may be unknown rather than idle.
    ts, pct = samples[0]
    start = ts - period_us
    idle = unknown = 0.0
    if cursor_us is not None:
        if start < cursor_us:
            start = cursor_us
        elif first_gap_unknown:
            unknown = start - cursor_us
        else:
            idle = start - cursor_us
    top = 100.0 if pct > 100.0 else 0.0 if pct < 0.0 else float(pct)
    first_span = ts - start if ts > start else 0.0  # a sample at the cursor covers nothing
    busy = top * first_span
    first_ts = prev = ts
    # The rest, each covering (max(ts - P, previous ts), ts]: the hot loop of every tick, so the
    # covered time is summed once at the end, and values are used as they come (a batch with one
    # out of range, which real drivers rarely report, is done again clamped).
    inner_idle = 0.0
    least = math.inf
    out_of_range = False
    for ts, pct in samples[1:]:
        gap = ts - prev
        if gap > period_us:
            inner_idle += gap - period_us
            busy += pct * period_us
        else:
            busy += pct * gap
            if gap < least:
                least = gap
        if pct > top:
            if gap > 0:  # a sample at the same instant covers nothing
                top = pct
        elif pct < 0:
            out_of_range = True
        prev = ts
    if out_of_range or top > 100.0:  # rare: the same batch again, each value clamped
        clamped = [(t, 100.0 if p > 100.0 else 0.0 if p < 0.0 else float(p)) for t, p in samples]
        return busy_from_samples(clamped, cursor_us, period_s, first_gap_unknown=first_gap_unknown)
    sampled = first_span + (prev - first_ts) - inner_idle
    return SampleBusy(busy / (100.0 * _US), sampled / _US, (idle + inner_idle) / _US, unknown / _US,
                      float(top), int(prev), least)  # fmt: skip


class SamplePeriod:
    """The device's utilisation sample period, learned from the spacing of its samples.

    Only spacings between two *busy* samples count: while the GPU works the driver samples at its
    regular rate, while it idles it may slow down or stop (those spacings say nothing about the
    period). Nor does a spacing longer than the longest documented period: the driver stopped
    between the two (the last sample of one burst and the first of the next are both busy).
    Regular sampling is the cluster of the smallest such spacings; the period is that cluster's
    median, widened for jitter, kept within NVML's documented range, and it only ever decreases
    (one burst of slow sampling must not stretch every later sample). Until one busy spacing is
    seen it is the shortest documented period: a period taken too short under-counts the first
    sample after an idle span; one taken too long would over-count it.
    """

    __slots__ = ("_spacings", "learned", "seconds", "useful_us")

    def __init__(self) -> None:
        self._spacings: deque[float] = deque(maxlen=_HISTORY)
        # Plain attributes, not properties: a reader consults them for every GPU at every tick.
        self.learned = False
        self.seconds = PERIOD_MIN_S  # the period in use
        # Spacings shorter than this can lower the estimate (it never grows): a reader whose batch
        # has none (busy_from_samples's least_gap_us) may skip observe, with the same result.
        self.useful_us = math.inf

    def observe(self, samples: Iterable[tuple[int, float]], previous: tuple[int, float] | None = None) -> None:
        """Learn from consecutive ``(timestamp_us, percent)`` samples (``previous``: the one before)."""
        # Once learned, only a spacing short enough to lower the estimate is worth remembering:
        # at steady state a read costs one comparison per sample.
        useful_us = self.useful_us
        it = iter(samples)
        if previous is None:
            previous = next(it, None)
            if previous is None:
                return
        prev_ts, prev_pct = previous
        added = False
        for ts, pct in it:
            gap = ts - prev_ts
            if 0 < gap < useful_us and gap <= _SPACING_MAX_US and pct > 0 and prev_pct > 0:
                self._spacings.append(gap / _US)
                added = True
            prev_ts, prev_pct = ts, pct
        if not added:
            return
        import statistics  # here, not at the top: it loads fractions and decimal, a cost at every run's start

        smallest = min(self._spacings)
        regular = [s for s in self._spacings if s <= smallest * _CLUSTER]
        estimate = min(max(statistics.median(regular) * _JITTER, PERIOD_MIN_S), PERIOD_MAX_S * _JITTER)
        self.seconds = min(self.seconds, estimate) if self.learned else estimate
        self.learned, self.useful_us = True, self.seconds / _JITTER * _US


class _Covered(Protocol):  # a GpuTick or a GpuInterval
    t0: float
    t1: float
    util_method: str | None
    util_unknown_s: float | None


def unmeasured_seconds(part: _Covered) -> float:
    """The time of a tick or interval the driver's samples could not cover (``util_unknown_s``)
    when no instant reading measured it: not in busy_s, and not idle either: unmeasured
    (docs/METERING.md).

    An interval carries the exact sum of its ticks' (``util_unmeasured_s``): once ticks that did
    and did not use the instant reading are merged, its method and unknown time can no longer
    tell. A tick, or an interval stored before that column, is judged by its own method. Like its
    busy time, a tick's unknown time may hold up to one sample period from before its start (time
    the previous read left to the next one's samples: the run's last reading classifies it), so it
    is bounded by its span plus the longest period, not by its span alone."""
    exact = getattr(part, "util_unmeasured_s", None)
    if exact is not None:
        return exact
    unknown = part.util_unknown_s
    if not unknown or not math.isfinite(unknown) or UTIL_INSTANT in (part.util_method or "").split(","):
        return 0.0
    return min(max(0.0, part.t1 - part.t0) + CARRY_MAX_S, max(0.0, unknown))
