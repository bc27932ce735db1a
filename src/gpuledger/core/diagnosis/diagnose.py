"""Reading a run for the user: bottleneck and failure findings from its intervals and events.

Pure functions (no I/O, no clock). ``diagnose(trace)`` runs every rule of ``diagnose_rules.py``
and returns findings, most severe first. A finding says what happened in plain language, with the
figures, what to do about it, and the evidence: time spans the report shades on its charts.
Every threshold is a field of ``Thresholds`` (documented in docs/REPORTS.md, checked by a test).

The intervals may be a big run's downsampled buckets (core/metering/series.py): each bucket is an exact
re-aggregation, so shares and peaks stay right; only spans shorter than a bucket blur.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuledger.core.metering.busy import unmeasured_seconds
from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, Metric, RunRecord

SEVERITIES = ("critical", "warning", "info")
MAX_EVIDENCE = 20  # spans per finding: the longest ones
PERF_THROTTLE = ("power", "thermal", "hw_slowdown", "hw_power_brake", "board_limit", "reliability")


@dataclass(frozen=True)
class Thresholds:
    """Every number a rule decides with. Shares are 0-1."""

    # input pipeline: GPUs starved while the CPU side is saturated
    starved_busy: float = 0.50  # mean busy share of the used GPUs below this = starved
    cpu_saturated: float = 0.85  # process tree CPU >= this share of the cores (or host CPU >= this)
    single_core: float = 0.85  # or a one-process tree using >= this many cores (GIL-bound loader)
    iowait_high: float = 0.15  # or host iowait >= this share of all cores' time
    input_min_share: float = 0.25  # ... during at least this share of the measured time
    input_min_s: float = 30.0  # ... and at least this long
    # memory leak: device memory rising across epochs
    leak_min_points: int = 4  # epochs (or time windows) after the first, warm-up, one
    leak_min_step: float = 0.005  # growth per epoch >= 0.5 % of the GPU's memory
    leak_min_rise: float = 0.03  # and >= 3 % in all
    leak_min_r2: float = 0.8  # a steady rise (least-squares fit)
    leak_rising_steps: float = 0.75  # share of epoch-to-epoch steps that rise
    # idle allocated GPUs
    unused_busy: float = 0.01  # a GPU busy less than 1 % of the run was never used
    idle_busy: float = 0.05  # spans under 5 % busy ...
    idle_span_s: float = 600.0  # ... lasting 10 min (runs under 50 min: 20 % of the run, >= 60 s)
    # throttling
    throttle_share: float = 0.10  # >= 10 % of GPU time slowed by power / thermal limits
    throttle_span: float = 0.5  # evidence: buckets more than half throttled
    # under-used GPU
    underused_mem: float = 0.35  # peak memory below 35 % of the GPU's ...
    underused_busy: float = 0.60  # ... and mean busy below 60 %
    # regression against earlier runs of the same configuration
    regression: float = 0.15  # >= 15 % slower per epoch, or costlier per mAP point
    regression_baseline_runs: int = 5  # the median of the latest earlier runs


@dataclass
class Evidence:
    """A time span a finding points at; the report shades it on ``charts``."""

    t0: float
    t1: float
    label: str = ""
    gpu: int | None = None  # the GPU index it is about; None: the run / host
    charts: tuple[str, ...] = ()  # chart ids (reports/run/charts.py); empty: every time chart


@dataclass
class Finding:
    rule: str
    severity: str  # "critical", "warning", "info"
    title: str  # one line
    detail: str  # what happened, with figures
    action: str  # what to do
    evidence: list[Evidence] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunFacts:
    """One run's headline figures for the regression rule (computed by the report loader)."""

    run_id: str
    started_at: float
    epochs: int = 0
    sec_per_epoch: float | None = None  # median epoch duration
    best_map: float | None = None  # best mAP50-95, 0-1
    busy_gpu_h: float | None = None
    cost: float | None = None  # in the rate card's currency, when a rate card prices the run
    currency: str | None = None


@dataclass
class Trace:
    """Everything the rules read about one run."""

    run: RunRecord
    devices: Sequence[GpuIdentity]
    gpu: dict[str, list[GpuInterval]]  # per device uuid, in time order
    host: list[HostInterval]
    events: list[Event]
    metrics: list[Metric]
    end: float  # where the run's measured time stops
    cpu_cores: int | None = None  # cores available to the run, when known
    facts: RunFacts | None = None
    history: list[RunFacts] = field(default_factory=list)  # earlier runs of the same configuration

    def device(self, uuid: str) -> GpuIdentity | None:
        return next((d for d in self.devices if d.uuid == uuid), None)

    def gpu_label(self, uuid: str) -> str:
        dev = self.device(uuid)
        return f"GPU {dev.index}" if dev is not None else f"GPU {uuid[:12]}"

    @property
    def wall_s(self) -> float:
        return max(0.0, self.end - self.run.started_at)


# -- helpers shared by the rules ------------------------------------------------------------------


def span_of(iv: GpuInterval | HostInterval) -> float:
    return max(0.0, iv.t1 - iv.t0)


def measured_s(iv: GpuInterval) -> float:
    """The part of the interval whose busy time was measured: its span less the time the driver's
    samples could not cover and no instant reading measured (docs/METERING.md: never guessed)."""
    return max(0.0, span_of(iv) - unmeasured_seconds(iv))


def busy_share(iv: GpuInterval) -> float | None:
    """Busy share of the interval's measured time; None when none of it was measured."""
    measured = measured_s(iv)
    if iv.busy_s is None or measured <= 0:
        return None
    return min(1.0, iv.busy_s / measured)


def device_busy(intervals: Iterable[GpuInterval]) -> tuple[float, float]:
    """(busy seconds, measured seconds) over the intervals that measured busy time; unmeasured
    time (unknown, no instant reading) is in neither."""
    busy = covered = 0.0
    for iv in intervals:
        if iv.busy_s is not None:
            busy += iv.busy_s
            covered += measured_s(iv)
    return busy, covered


def merge_spans(spans: Iterable[tuple[float, float]], gap_s: float = 1e-6) -> list[tuple[float, float]]:
    """Overlapping or touching spans joined, in time order."""
    out: list[tuple[float, float]] = []
    for t0, t1 in sorted(spans):
        if out and t0 <= out[-1][1] + gap_s:
            out[-1] = (out[-1][0], max(out[-1][1], t1))
        else:
            out.append((t0, t1))
    return out


def runs_where(intervals: Sequence[GpuInterval], test) -> list[tuple[float, float]]:
    """Contiguous stretches of intervals for which ``test(interval)`` is true."""
    return merge_spans(((iv.t0, iv.t1) for iv in intervals if test(iv)), gap_s=1.0)


def overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def gpu_busy_on(grid: Sequence[tuple[float, float]], intervals: Sequence[GpuInterval]) -> list[float | None]:
    """Mean busy share of one device over each window of ``grid`` (time-ordered, non-overlapping),
    each interval shared out in proportion to its overlap (a two-pointer sweep), of the measured
    time only; None for a window with none."""
    out: list[float | None] = []
    j = 0
    ivs = [iv for iv in intervals if iv.busy_s is not None]
    for t0, t1 in grid:
        while j < len(ivs) and ivs[j].t1 <= t0:
            j += 1
        busy = covered = 0.0
        k = j
        while k < len(ivs) and ivs[k].t0 < t1:
            iv = ivs[k]
            part = overlap(t0, t1, iv.t0, iv.t1)
            span = span_of(iv)
            if span > 0 and part > 0:
                busy += iv.busy_s * part / span  # type: ignore[operator]
                covered += measured_s(iv) * part / span
            k += 1
        out.append(min(1.0, busy / covered) if covered > 0 else None)
    return out


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """(slope, intercept, r²) of the least-squares line; r² is 0 for a flat or single point."""
    n = len(xs)
    if n < 2:
        return 0.0, ys[0] if ys else 0.0, 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    sxy = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    syy = math.fsum((y - my) ** 2 for y in ys)
    if sxx == 0:
        return 0.0, my, 0.0
    slope = sxy / sxx
    r2 = 0.0 if syy == 0 else (sxy * sxy) / (sxx * syy)
    return slope, my - slope * mx, r2


def pct(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio * 100:.0f} %"


def gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 2**30:.1f} GiB"


def minutes(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def used_gpus(trace: Trace, th: Thresholds) -> list[str]:
    used = []
    for uuid, ivs in trace.gpu.items():
        busy, covered = device_busy(ivs)
        if covered > 0 and busy / covered >= th.unused_busy:
            used.append(uuid)
    return used


def longest(spans_: list[tuple[float, float]], limit: int = MAX_EVIDENCE) -> list[tuple[float, float]]:
    return sorted(sorted(spans_, key=lambda s: s[0] - s[1])[:limit])


def gpu_index(trace: Trace, uuid: str) -> int | None:
    dev = trace.device(uuid)
    return dev.index if dev is not None else None


# -- entry point ----------------------------------------------------------------------------------


def diagnose(trace: Trace, thresholds: Thresholds | None = None) -> list[Finding]:
    """Every rule's findings, most severe first (then by rule order)."""
    from gpuledger.core.diagnosis import rules as diagnose_rules

    th = thresholds or Thresholds()
    found: list[Finding] = []
    for rule in diagnose_rules.RULES:
        found.extend(rule(trace, th, found))
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(found, key=lambda f: order.get(f.severity, len(order)))
