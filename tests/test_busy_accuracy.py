"""Recorded busy time against the ground truth, for any workload and any sampling behaviour.

The scripted NVML (collect/fake_nvml*.py) behaves like the hardware: per-product sample periods,
sampling that slows or stops while idle, a finite ring buffer, integer percentages. The real
collector reads it at the recorder's tick cadence and ticks are merged into intervals as the
recorder does; the sum must be within 1 % of the truth plus one sample period per run, whatever
the interval (1 s to 60 s). A naive poller — one instantaneous reading every 30 s, standing for
those 30 s, the way `nvidia-smi -l 30` is used — errs by far more on the same loads.

One allowance on top, the documented limit (docs/METERING.md): NVML does not report the sample
period, so it is learned from two consecutive busy samples; a busy sample handed out before that
is taken to cover the shortest documented period (1/6 s). On a 1 s product an isolated busy sample
and its neighbours look exactly as on a 1/6 s product that samples once a second while idle, so
nothing could tell the longer period; each such sample may be short by up to 5/6 s, never over.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuledger.collect.fake_nvml import FakeGpu, FakeNvml, TracePoint
from gpuledger.collect.fake_nvml_profiles import DEFAULT_UPTIME_S, PROFILES
from gpuledger.collect.nvml import NvmlCollector
from gpuledger.core.metering.busy import PERIOD_MAX_S, PERIOD_MIN_S
from gpuledger.core.metering.intervals import merge_gpu_ticks
from gpuledger.recorder.recorder import tick_seconds

T0 = 1_700_000_000.0
UUID = "GPU-5d3c1f4e-0000-4000-8000-000000000001"
SAMPLING = [(name, idle) for name in sorted(PROFILES) for idle in ("grid", "slow", "stop")]
UPTIME_S = 3 * 86_400.0  # the host's boot clock at T0
# The clock NVML stamps samples with, as drivers do: the wall clock, the host's boot clock, or one
# the collector cannot read (boot-clock stamps on a host whose boot clock says otherwise).
STAMP_CLOCKS = ("wall", "boot", "other")


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def truth(points: list[TracePoint], a: float, b: float) -> float:
    """Busy-seconds of a stepped utilisation trace over (a, b], trace seconds."""
    total = 0.0
    for i, p in enumerate(points):
        end = points[i + 1].t if i + 1 < len(points) else math.inf
        lo, hi = max(a, p.t), min(b, end)
        if hi > lo:
            total += (p.util_pct or 0) / 100 * (hi - lo)
    return total


STARVED = [
    TracePoint(t, util_pct=util, power_w=100.0 + 3 * util, mem_used_b=2**30)
    for k in range(24)
    for t, util in ((k * 2.6, 100), (k * 2.6 + 2.0, 0))
] + [TracePoint(24 * 2.6, util_pct=0)]


# Found by this test (2026-12-04): a short light burst, a stop of the driver's sampling, then a
# longer one. The tail sample of the first burst and the head sample of the second are both busy:
# their 9.3 s spacing was once taken for the sample period, and the head sample charged over 1.1 s.
STOP_BETWEEN_BURSTS = [
    TracePoint(t, util_pct=util, power_w=100.0 + 3 * util, mem_used_b=2**30)
    for t, util in ((0.0, 0), (8.0, 12), (8.5, 0), (10.125, 0), (17.875, 55), (20.875, 0))
]


@st.composite
def workloads(draw: st.DrawFn) -> list[TracePoint]:
    """Busy and idle stretches: steady training, input-starved bursts, long idle spans."""
    points, t = [], 0.0
    while t < draw(st.floats(20, 240)):
        util = draw(st.sampled_from([0, 0, 0, 12, 55, 90, 100]))
        points.append(TracePoint(t, util_pct=util, power_w=100.0 + 3 * util, mem_used_b=2**30))
        t += draw(st.floats(0.2, 12.0))
    points.append(TracePoint(t, util_pct=0))
    return points


def record(
    points: list[TracePoint],
    profile: str,
    idle: str,
    interval_s: float,
    rnd: random.Random,
    seen: dict[int, int] | None = None,
    stamps: str = "wall",
):
    """(recorded busy-seconds, recorded intervals, end of recording in trace seconds, sample period);
    ``seen`` collects every utilisation sample the driver handed out (timestamp µs -> percent),
    rebased onto the wall clock; ``stamps``: one of STAMP_CLOCKS."""
    clock = Clock()
    gpu = FakeGpu(UUID, name="NVIDIA GPU", points=points, profile=profile, idle_sampling=idle)
    boot = (lambda: clock.t - T0 + UPTIME_S) if stamps == "boot" else (lambda: 60.0)  # "other": booted a minute ago
    fake = FakeNvml([gpu], clock=clock, start=T0, sample_clock="wall" if stamps == "wall" else "boot", boot_clock=boot)
    rebase = 0 if stamps == "wall" else round((T0 - UPTIME_S) * 1e6) if stamps == "boot" else None
    if seen is not None:
        samples = fake.nvmlDeviceGetSamples

        def spy(handle, kind, after):
            vtype, got = samples(handle, kind, after)
            seen.update((int(x.timeStamp) + shift, int(x.sampleValue.uiVal)) for x in got)
            return vtype, got

        fake.nvmlDeviceGetSamples = spy
        # "other": trace second 0 is DEFAULT_UPTIME_S on the samples' clock
        shift = rebase if rebase is not None else round((T0 - DEFAULT_UPTIME_S) * 1e6)
    col = NvmlCollector(nvml=fake, clock=clock, boot=boot)
    tick = tick_seconds(interval_s)
    col.read(set(), clock.t)  # the recorder primes at the start
    ticks, intervals, start = [], [], clock.t
    end = T0 + points[-1].t + 2.0
    while clock.t < end:
        clock.t += tick * rnd.uniform(0.9, 1.1)  # ticks land a little late or early
        ticks += col.read(set(), clock.t).ticks
        if ticks and clock.t - start >= interval_s - tick / 2:  # the recorder's close rule
            intervals.append(merge_gpu_ticks(UUID, len(intervals), ticks))
            ticks, start = [], clock.t
    if ticks:
        intervals.append(merge_gpu_ticks(UUID, len(intervals), ticks))
    period = gpu.sample_period_s or PROFILES[profile].sample_period_s
    return math.fsum(i.busy_s or 0.0 for i in intervals), intervals, clock.t - T0, period


def unlearned_busy_samples(seen: dict[int, int], after_us: int) -> int:
    """Busy samples newer than ``after_us`` (the run's start) up to the first two consecutive busy
    ones: until then the period cannot be known from the samples (the module doc)."""
    values = [v for ts, v in sorted(seen.items()) if ts > after_us]
    for i, v in enumerate(values):
        if v > 0 and i + 1 < len(values) and values[i + 1] > 0:
            return sum(1 for x in values[: i + 1] if x > 0)
    return sum(1 for x in values if x > 0)


def naive_poll(points: list[TracePoint], profile: str, every_s: float, end: float) -> float:
    """One instantaneous utilisation reading every ``every_s``, standing for the span before it."""
    clock = Clock()
    fake = FakeNvml([FakeGpu(UUID, name="NVIDIA GPU", points=points, profile=profile)], clock=clock, start=T0)
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    busy, t = 0.0, 0.0
    while t < end:
        step = min(every_s, end - t)
        t += step
        clock.t = T0 + t
        busy += fake.nvmlDeviceGetUtilizationRates(h).gpu / 100 * step
    return busy


@pytest.mark.parametrize("stamps", STAMP_CLOCKS)
@pytest.mark.parametrize("interval_s", [1.0, 5.0, 30.0, 60.0])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(points=workloads(), which=st.sampled_from(SAMPLING), seed=st.integers(0, 2**16))
# Always tried as well: an input-starved training whose idle gaps are shorter than a tick, on a
# driver that stops sampling while idle, so gaps inside one read's batch are common (a sample
# after one covers one period, not the gap: random workloads meet this case only now and then).
@example(points=STARVED, which=(sorted(PROFILES)[0], "stop"), seed=1)
@example(points=STOP_BETWEEN_BURSTS, which=("ada-consumer", "stop"), seed=1)
def test_recorded_busy_time_is_within_one_percent_plus_one_period(points, which, seed, interval_s, stamps) -> None:
    profile, idle = which
    seen: dict[int, int] = {}
    busy, intervals, end, period = record(points, profile, idle, interval_s, random.Random(seed), seen, stamps)
    expected = truth(points, 0.0, end)
    unlearned = unlearned_busy_samples(seen, int(T0 * 1e6)) * (period - PERIOD_MIN_S)  # 0 on 1/6 s products
    assert expected - unlearned - 0.01 * expected - period - 1e-6 <= busy, (busy, expected, unlearned)
    assert busy <= expected + 0.01 * expected + period + 1e-6, (busy, expected)  # never over
    for iv in intervals:  # no interval holds more busy time than its span (plus one period carried in)
        assert (iv.busy_s or 0.0) <= iv.t1 - iv.t0 + period + 1e-6
        assert iv.util_method == "samples" and iv.util_unknown_s == 0
        if stamps != "other":  # on a clock gpuledger reads, each interval records its own idle time
            assert (iv.util_idle_s or 0.0) <= iv.t1 - iv.t0 + PERIOD_MAX_S + 1e-6, (iv.util_idle_s, iv.t1 - iv.t0)
    # Time classified (busy, idle) never exceeds the recording: nothing from before it is counted.
    assert math.fsum((iv.util_idle_s or 0.0) + (iv.busy_s or 0.0) for iv in intervals) <= end + period + 1e-6


def test_a_naive_30_s_poller_errs_by_far_more_on_the_same_loads() -> None:
    rnd = random.Random(7)
    ours, naive = [], []
    for _ in range(12):  # input-starved trainings: busy bursts of 1-6 s, idle gaps of 0.5-4 s
        points, t = [], 0.0
        while t < 300:
            points.append(TracePoint(t, util_pct=rnd.choice([85, 100]), power_w=300.0))
            t += rnd.uniform(1, 6)
            points.append(TracePoint(t, util_pct=0, power_w=80.0))
            t += rnd.uniform(0.5, 4)
        points.append(TracePoint(t, util_pct=0))
        busy, _, end, _ = record(points, "hopper", "stop", 5.0, rnd)
        expected = truth(points, 0.0, end)
        ours.append(abs(busy - expected) / expected)
        naive.append(abs(naive_poll(points, "hopper", 30.0, end) - expected) / expected)
    assert max(ours) < 0.01
    assert sum(naive) / len(naive) > 10 * sum(ours) / len(ours)
    assert max(naive) > 0.05
