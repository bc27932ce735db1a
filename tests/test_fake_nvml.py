"""The scripted NVML behaves like NVIDIA hardware, as NVML's documentation and field reports describe it.

Every check goes through the pynvml-shaped API only, the way the collector sees the fake.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.collect import fake_nvml_profiles as tables
from gpuledger.collect.fake_nvml import Failing, FakeGpu, FakeNvml, TracePoint

UTIL = pynvml.NVML_GPU_UTILIZATION_SAMPLES
T0 = 1000.0


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def one_gpu(clock: Clock, **kw) -> tuple[FakeNvml, object]:
    nvml_kw = {
        k: kw.pop(k)
        for k in ("wall_clock", "reloads", "host_pid_offset", "pid_translation", "sample_clock", "boot_clock")
        if k in kw
    }
    points = kw.pop(
        "points",
        [
            TracePoint(0, util_pct=40, mem_used_b=2_000, power_w=100, temp_c=50, sm_clock_mhz=1400),
            TracePoint(10, util_pct=100, power_w=300, throttle=("power", "thermal")),
        ],
    )
    fake = FakeNvml([FakeGpu("GPU-a", points=points, **kw)], clock=clock, start=clock.t, **nvml_kw)
    fake.nvmlInit()
    return fake, fake.nvmlDeviceGetHandleByIndex(0)


def samples(fake: FakeNvml, h: object, last_ts: int = 0) -> list[tuple[int, int]]:
    try:
        _, got = fake.nvmlDeviceGetSamples(h, UTIL, last_ts)
    except pynvml.NVMLError_NotFound:
        return []
    return [(s.timeStamp, s.sampleValue.uiVal) for s in got]


def field(fake: FakeNvml, h: object, fid: int):
    (fv,) = fake.nvmlDeviceGetFieldValues(h, [fid])
    return fv


def stepped_integral(points: list[tuple[float, float]], a: float, b: float) -> float:
    """Integral over [a, b] of a stepped series; the first value also holds before the first point."""
    total = 0.0
    for i, (t, v) in enumerate(points):
        lo = -float("inf") if i == 0 else t
        hi = points[i + 1][0] if i + 1 < len(points) else float("inf")
        lo, hi = max(a, lo), min(b, hi)
        if hi > lo:
            total += v * (hi - lo)
    return total


# -- the fake's own tables ------------------------------------------------------------------------
def test_tables_are_the_fakes_own_and_match_nvml() -> None:
    folder = Path(tables.__file__).parent
    for module in ("fake_nvml", "fake_nvml_core", "fake_nvml_gpu", "fake_nvml_profiles"):
        tree = ast.parse((folder / f"{module}.py").read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not {m for m in imported if m and m.startswith("gpuledger") and "fake_nvml" not in m}, module
    assert tables.REASON_BITS["power"] == pynvml.nvmlClocksEventReasonSwPowerCap
    assert tables.REASON_BITS["thermal"] == pynvml.nvmlClocksEventReasonSwThermalSlowdown
    assert tables.REASON_BITS["hw_thermal"] == pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert tables.REASON_BITS["low_util"] == pynvml.nvmlClocksEventReasonGpuIdle
    assert tables.REASON_BITS["sync_boost"] == pynvml.nvmlClocksEventReasonSyncBoost
    assert tables.REASON_BITS["hw_slowdown"] == pynvml.nvmlClocksEventReasonHwSlowdown
    assert tables.REASON_BITS["hw_power_brake"] == pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    assert tables.REASON_BITS["board_limit"] == pynvml.nvmlClocksThrottleReasonBoardLimit
    assert tables.REASON_BITS["reliability"] == pynvml.nvmlClocksThrottleReasonReliability
    assert tables.PERF_POLICY_POWER == pynvml.NVML_PERF_POLICY_POWER
    assert tables.PERF_POLICY_THERMAL == pynvml.NVML_PERF_POLICY_THERMAL
    assert tables.PERF_POLICY_RELIABILITY == pynvml.NVML_PERF_POLICY_RELIABILITY
    assert tables.FI_PERF_POLICY[pynvml.NVML_FI_DEV_PERF_POLICY_POWER] == pynvml.NVML_PERF_POLICY_POWER
    assert tables.FI_PERF_POLICY[pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL] == pynvml.NVML_PERF_POLICY_THERMAL
    assert tables.FI_PERF_POLICY[pynvml.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST] == pynvml.NVML_PERF_POLICY_SYNC_BOOST
    assert tables.FI_PERF_POLICY[pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT] == pynvml.NVML_PERF_POLICY_BOARD_LIMIT
    low = pynvml.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION
    assert tables.FI_PERF_POLICY[low] == pynvml.NVML_PERF_POLICY_LOW_UTILIZATION
    assert tables.FI_PERF_POLICY[pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY] == pynvml.NVML_PERF_POLICY_RELIABILITY
    assert tables.FI_TOTAL_ENERGY_CONSUMPTION == pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
    assert (tables.FI_POWER_AVERAGE, tables.FI_POWER_INSTANT) == (
        pynvml.NVML_FI_DEV_POWER_AVERAGE,
        pynvml.NVML_FI_DEV_POWER_INSTANT,
    )
    assert (tables.ARCH_VOLTA, tables.ARCH_TURING, tables.ARCH_AMPERE) == (
        pynvml.NVML_DEVICE_ARCH_VOLTA,
        pynvml.NVML_DEVICE_ARCH_TURING,
        pynvml.NVML_DEVICE_ARCH_AMPERE,
    )
    assert (tables.ARCH_ADA, tables.ARCH_HOPPER, tables.ARCH_UNKNOWN) == (
        pynvml.NVML_DEVICE_ARCH_ADA,
        pynvml.NVML_DEVICE_ARCH_HOPPER,
        pynvml.NVML_DEVICE_ARCH_UNKNOWN,
    )


def test_constants_and_error_classes_are_pynvmls() -> None:
    assert FakeNvml.NVML_GPU_UTILIZATION_SAMPLES == pynvml.NVML_GPU_UTILIZATION_SAMPLES
    assert FakeNvml.NVMLError_NotSupported is pynvml.NVMLError_NotSupported
    assert FakeNvml.nvmlMemory_v2 == pynvml.nvmlMemory_v2
    fake, h = one_gpu(Clock(), unsupported=frozenset({"nvmlDeviceGetTemperature"}))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)


def test_error_strings_are_bytes_like_pynvmls() -> None:
    assert FakeNvml.nvmlErrorString(pynvml.NVML_ERROR_NOT_SUPPORTED) == b"Not Supported"
    assert FakeNvml.nvmlErrorString(pynvml.NVML_ERROR_UNKNOWN) == b"Unknown Error"


def test_uninitialised_and_missing_library() -> None:
    fake = FakeNvml([FakeGpu("GPU-a")], clock=Clock())
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        FakeNvml([], clock=Clock(), library_missing=True).nvmlInit()


# -- product profiles -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "profile", "arch"),
    [
        ("NVIDIA H100 80GB HBM3", "hopper", pynvml.NVML_DEVICE_ARCH_HOPPER),
        ("NVIDIA H200", "h200", pynvml.NVML_DEVICE_ARCH_HOPPER),
        ("NVIDIA GH200 480GB", "hopper", pynvml.NVML_DEVICE_ARCH_HOPPER),
        ("NVIDIA A100-SXM4-80GB", "ampere-ga100", pynvml.NVML_DEVICE_ARCH_AMPERE),
        ("NVIDIA A10G", "ampere", pynvml.NVML_DEVICE_ARCH_AMPERE),
        ("Tesla V100-SXM2-16GB", "volta", pynvml.NVML_DEVICE_ARCH_VOLTA),
        ("Tesla T4", "turing", pynvml.NVML_DEVICE_ARCH_TURING),
        ("NVIDIA GeForce RTX 4090", "ada-consumer", pynvml.NVML_DEVICE_ARCH_ADA),
        ("Some Future GPU", "default", pynvml.NVML_DEVICE_ARCH_UNKNOWN),
    ],
)
def test_profile_and_architecture_come_from_the_name(name: str, profile: str, arch: int) -> None:
    assert tables.profile_for_name(name).name == profile
    fake, h = one_gpu(Clock(), name=name)
    assert fake.nvmlDeviceGetArchitecture(h) == arch
    fake, h = one_gpu(Clock(), name=name, profile="ideal")  # the ideal profile keeps the architecture
    assert fake.nvmlDeviceGetArchitecture(h) == arch


def test_profiles_cover_both_ends_of_the_documented_sample_period() -> None:
    periods = {p.sample_period_s for p in tables.PROFILES.values()}
    assert min(periods) == pytest.approx(1 / 6) and max(periods) == 1.0
    assert {p.idle_sampling for p in tables.PROFILES.values()} == {"grid", "slow", "stop"}
    with pytest.raises(ValueError, match="unknown profile 'h100'"):
        one_gpu(Clock(), profile="h100")
    with pytest.raises(ValueError, match="process_list must be one of compute, mps, graphics"):
        one_gpu(Clock(), process_list="cuda")


# -- utilisation samples --------------------------------------------------------------------------
def test_samples_newer_than_the_cursor_in_buffer_order() -> None:
    clock = Clock()
    fake, h = one_gpu(clock)  # A100: 1/6 s, 120 samples, phase from the uuid
    clock.t += 1.0
    vtype, got = fake.nvmlDeviceGetSamples(h, UTIL, 0)
    assert vtype == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    ts = [s.timeStamp for s in got]
    assert all(b - a == 166_667 for a, b in itertools.pairwise(ts))
    assert ts[-1] <= (T0 + 1) * 1e6 and ts[-1] % 166_667 != (T0 * 1e6) % 166_667  # not on whole seconds
    assert {s.sampleValue.uiVal for s in got} == {40}
    assert [s[0] for s in samples(fake, h, ts[-3])] == ts[-2:]
    with pytest.raises(pynvml.NVMLError_NotFound):  # nothing newer yet
        fake.nvmlDeviceGetSamples(h, UTIL, ts[-1])
    clock.t += 1000
    assert len(samples(fake, h, ts[-1])) == 120  # the ring keeps the last buffer_len samples
    for _ in range(6):  # read without a cursor every 5 s: 30 new samples each time, the ring stays full
        clock.t += 5
        kept = samples(fake, h, 0)
        assert len(kept) == 120 and kept[-1][0] - kept[0][0] == 119 * 166_667


def test_a_sample_covers_the_period_before_its_timestamp() -> None:
    clock = Clock(0.0)
    pts = [TracePoint(0, util_pct=0), TracePoint(0.5, util_pct=100)]
    fake, h = one_gpu(clock, points=pts, sample_period_s=1.0, sample_phase_s=0.25, idle_sampling="grid")
    clock.t = 2.0
    assert samples(fake, h)[-2:] == [(250_000, 0), (1_250_000, 75)]  # (0.25, 1.25] ran a kernel 0.75 s
    assert fake.nvmlDeviceGetUtilizationRates(h).gpu == 75  # the last complete period


@settings(max_examples=80, deadline=None)
@given(
    steps=st.lists(st.tuples(st.floats(0.01, 5.0), st.just(0) | st.integers(0, 100) | st.floats(0, 100)), max_size=12),
    reads=st.lists(st.floats(0.05, 9.0), min_size=1, max_size=15),
    period=st.sampled_from([1 / 6, 0.25, 0.5, 1.0]),
    phase=st.floats(0, 0.999),
    idle=st.sampled_from(["grid", "slow", "stop"]),
)
def test_samples_add_up_to_the_scripted_busy_time(steps, reads, period, phase, idle) -> None:
    """Sum of value x period over the samples read is the scripted integral of utilisation over
    the span they cover, to within half a percent of a period per sample (integer rounding).
    Time between samples left by slowed or stopped idle sampling holds no work."""
    t, series = 0.0, [(0.0, 0.0)]
    for gap, util in steps:
        t += gap
        series.append((t, float(util)))
    clock = Clock()
    points = [TracePoint(at, util_pct=u) for at, u in series]
    fake, h = one_gpu(clock, points=points, sample_period_s=period, sample_phase_s=phase * period, idle_sampling=idle)
    got: list[tuple[int, int]] = []
    clock.t += 0.01
    cursor = max((ts for ts, _ in samples(fake, h, 0)), default=0)  # what the buffer held before the run: skipped
    for gap in reads:
        clock.t += gap
        new = samples(fake, h, cursor)
        got += new
        cursor = max([cursor, *(ts for ts, _ in new)])
    if not got:  # reads too close together for a new sample, or an idle GPU that stopped sampling
        return
    period_us = round(period * 1e6)
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(got)]
    assert all(g > 0 and g % period_us == 0 for g in gaps)  # on the grid, in order
    if idle == "grid":
        assert set(gaps) <= {period_us}  # nothing skipped
    first, last = (got[0][0] - T0 * 1e6) / 1e6 - period_us / 1e6, (got[-1][0] - T0 * 1e6) / 1e6
    truth = stepped_integral(series, first, last) / 100
    measured = sum(v for _, v in got) / 100 * period_us / 1e6
    assert measured == pytest.approx(truth, abs=len(got) * 0.005 * period + 1e-9)


def test_idle_gpu_stops_sampling_then_resumes_with_one_period() -> None:
    clock, per = Clock(0.0), 166_667  # Hopper: 1/6 s, no sample while idle
    pts = [TracePoint(0, util_pct=80), TracePoint(2, util_pct=0), TracePoint(10.05, util_pct=60)]
    fake, h = one_gpu(clock, points=pts, name="NVIDIA H100 80GB HBM3", sample_phase_s=0.0)
    clock.t = 2.5
    busy = samples(fake, h)
    assert busy[-1] == (12 * per, 80)  # the last instant whose period held work (up to 2.0 s)
    clock.t = 10.0
    with pytest.raises(pynvml.NVMLError_NotFound):  # the ring ran dry while idle (gpu-metrics-agent PR 37)
        fake.nvmlDeviceGetSamples(h, UTIL, busy[-1][0])
    assert fake.nvmlDeviceGetUtilizationRates(h).gpu == 0  # the instant reading still answers
    clock.t = 10.5
    resumed = samples(fake, h, busy[-1][0])
    # the first sample is at the first instant whose period holds work, and covers that period only
    assert resumed[:2] == [(61 * per, round(60 * (61 * per - 10_050_000) / per)), (62 * per, 60)]


def test_h200_answers_as_one_was_seen_to() -> None:
    # What the device check read from a real H200 (driver 580.159.04) with its GPU idle: a sample
    # every 0.2 s, values 0, 71 in the buffer; a cursor at the newest one answers NotFound.
    clock = Clock(0.0)
    fake, h = one_gpu(clock, points=[TracePoint(0, util_pct=0)], name="NVIDIA H200", sample_phase_s=0.0)
    clock.t = 30.0
    got = samples(fake, h)
    assert len(got) == 71
    assert [b - a for (a, _), (b, _) in itertools.pairwise(got)] == [200_000] * 70
    assert {v for _, v in got} == {0} and got[-1][0] == 30_000_000
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetSamples(h, UTIL, got[-1][0])


def test_idle_gpu_samples_slowly_on_ga100() -> None:
    clock, per = Clock(0.0), 166_667  # A100: one sample a second while idle (assumed)
    pts = [TracePoint(0, util_pct=50), TracePoint(1, util_pct=0)]
    fake, h = one_gpu(clock, points=pts, sample_phase_s=0.0)
    clock.t = 6.0
    got = samples(fake, h)
    last_busy = 6  # the period ending at 1.000002 s still holds work; idle samples follow a second apart
    assert [ts for ts, _ in got if ts > last_busy * per] == [(last_busy + 6 * j) * per for j in (1, 2, 3, 4)]
    assert {v for ts, v in got if ts > last_busy * per} == {0}


def test_ideal_profile_samples_an_idle_gpu_on_the_grid() -> None:
    clock = Clock(0.0)
    fake, h = one_gpu(clock, points=[TracePoint(0, util_pct=0)], name="NVIDIA H100 80GB HBM3", profile="ideal")
    clock.t = 2.0
    assert [ts for ts, _ in samples(fake, h)][-11:] == [k * 166_667 for k in range(1, 12)]  # 12 * 166_667 > 2 s


def test_wall_clock_steps_show_in_the_timestamps() -> None:
    clock, wall = Clock(), Clock(5_000.0)  # the host's wall clock, apart from the trace clock
    fake, h = one_gpu(clock, wall_clock=wall, profile="ideal")
    clock.t += 1.0
    wall.t += 1.0
    before = samples(fake, h)
    assert before[-1][0] == 5_000_000_000 + 5 * 166_667  # trace 0.8333 s, stamped on the wall clock
    clock.t += 1.0
    wall.t += 1.0 - 30.0  # NTP steps the host clock back 30 s
    after = samples(fake, h, 0)
    new = after[-6:]
    assert new[0][0] < before[-1][0]  # buffer order: the timestamps go back
    assert samples(fake, h, before[-1][0]) == []  # a cursor at the newest timestamp seen misses them
    assert [b - a for (a, _), (b, _) in itertools.pairwise(new)] == [166_667] * 5


@pytest.mark.parametrize("boot_clock", [None, "host"])
def test_boot_clock_stamps_are_microseconds_since_boot_and_never_step(boot_clock) -> None:
    # Some drivers stamp samples with CLOCK_BOOTTIME (NVML documents no epoch for them): the
    # utilisation and the per-process samples alike; field values keep the Unix epoch.
    clock, wall = Clock(), Clock(5_000.0)
    up = 3_600.0  # the host booted an hour before trace second 0
    boot = None if boot_clock is None else (lambda: clock.t - T0 + up)
    points = [TracePoint(0, util_pct=100, power_w=300, procs={1234: (2**30, 90)})]
    fake, h = one_gpu(clock, wall_clock=wall, profile="ideal", points=points, sample_clock="boot", boot_clock=boot)
    base = tables.DEFAULT_UPTIME_S if boot is None else up
    clock.t += 1.0
    wall.t += 1.0 - 30.0  # a wall-clock step back: the boot clock does not step
    assert samples(fake, h)[-1][0] == round(base * 1e6) + 5 * 166_667
    (proc,) = fake.nvmlDeviceGetProcessUtilization(h, 0)
    assert proc.timeStamp == round(base * 1e6) + 5 * 166_667
    assert field(fake, h, pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION).timestamp == round((wall.t) * 1e6)
    with pytest.raises(ValueError, match="sample_clock"):
        FakeNvml([], clock=clock, sample_clock="gpu")


def test_driver_reload_empties_the_buffer_and_restarts_the_energy_counter() -> None:
    clock = Clock()
    fake, h = one_gpu(clock, reloads=[(5.0, 6.0)], profile="ideal")
    clock.t += 4
    assert fake.nvmlDeviceGetTotalEnergyConsumption(h) == 400_000
    clock.t += 3  # the driver came back at 6.0
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetTotalEnergyConsumption(h) == 100_000  # mJ since the driver was last reloaded
    assert samples(fake, h)[0][0] > (T0 + 6) * 1e6  # nothing from before the reload


# -- energy and power -----------------------------------------------------------------------------
def test_energy_counter_moves_in_steps() -> None:
    clock = Clock()
    fake, h = one_gpu(clock, points=[TracePoint(0, power_w=100)], name="NVIDIA H100 80GB HBM3")  # 100 ms steps
    readings = []
    for _ in range(1000):  # every millisecond for a second
        clock.t += 0.001
        readings.append(fake.nvmlDeviceGetTotalEnergyConsumption(h))
    steps = [b - a for a, b in itertools.pairwise(readings) if b != a]
    assert len(steps) == 10 and set(steps[1:]) == {10_000}  # 100 W x 0.1 s, ten times a second
    assert 0 < steps[0] < 10_000  # the first update after the trace starts holds part of a step


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(st.tuples(st.floats(0.01, 3.0), st.floats(0, 700)), min_size=1, max_size=10),
    reads=st.lists(st.floats(0.001, 2.0), min_size=1, max_size=20),
    profile=st.sampled_from(["hopper", "volta", "ampere-ga100"]),
)
def test_energy_counter_is_never_ahead_of_the_true_integral(steps, reads, profile) -> None:
    t, series = 0.0, []
    for gap, watts in steps:
        series.append((t, watts))
        t += gap
    clock = Clock()
    fake, h = one_gpu(clock, points=[TracePoint(at, power_w=w) for at, w in series], profile=profile)
    update = tables.PROFILES[profile].energy_update_s
    for gap in reads:
        clock.t += gap
        now = clock.t - T0
        counter = fake.nvmlDeviceGetTotalEnergyConsumption(h)
        true_mj = stepped_integral(series, 0, now) * 1000
        assert counter <= true_mj + 1e-6  # never ahead of the power really drawn
        assert counter >= stepped_integral(series, 0, now - update) * 1000 - 1 - 1e-6  # at most one step behind


def test_energy_counter_wraps_and_resets() -> None:
    clock = Clock()
    fake, h = one_gpu(clock, energy_offset_mj=(1 << 64) - 50_000, profile="ideal")
    clock.t += 1
    assert fake.nvmlDeviceGetTotalEnergyConsumption(h) == 50_000  # wrapped past 2**64
    clock = Clock()
    pts = [TracePoint(0, power_w=100, energy_j=5_000), TracePoint(2, energy_j=10)]  # a reset at t=2
    fake, h = one_gpu(clock, points=pts, profile="ideal")
    clock.t += 1
    assert fake.nvmlDeviceGetTotalEnergyConsumption(h) == 5_100_000
    clock.t += 2
    assert fake.nvmlDeviceGetTotalEnergyConsumption(h) == 110_000
    assert field(fake, h, pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION).value.ullVal == 110_000


def test_power_usage_lags_a_step_by_the_averaging_window_on_hopper() -> None:
    clock = Clock()
    pts = [TracePoint(0, power_w=100), TracePoint(10, power_w=300)]
    fake, h = one_gpu(clock, points=pts, name="NVIDIA H100 80GB HBM3")
    clock.t += 10.5
    assert fake.nvmlDeviceGetPowerUsage(h) == 200_000  # the mean over the last second
    instant = field(fake, h, pynvml.NVML_FI_DEV_POWER_INSTANT)
    assert (instant.valueType, instant.value.uiVal) == (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 300_000)
    assert field(fake, h, pynvml.NVML_FI_DEV_POWER_AVERAGE).value.uiVal == 200_000
    clock.t += 0.5
    assert fake.nvmlDeviceGetPowerUsage(h) == 300_000  # caught up a window after the step


def test_power_usage_is_instantaneous_on_ga100_and_volta() -> None:
    for name in ("NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB"):
        clock = Clock()
        fake, h = one_gpu(clock, points=[TracePoint(0, power_w=100), TracePoint(10, power_w=300)], name=name)
        clock.t += 10.5
        assert fake.nvmlDeviceGetPowerUsage(h) == 300_000, name
        assert field(fake, h, pynvml.NVML_FI_DEV_POWER_AVERAGE).value.uiVal == 200_000, name


# -- field values and sensors ---------------------------------------------------------------------
def test_field_values_are_shaped_like_pynvmls() -> None:
    clock, wall = Clock(), Clock(7_000.0)
    fake, h = one_gpu(clock, wall_clock=wall, extra_fields={pynvml.NVML_FI_DEV_MEMORY_TEMP: 61})
    clock.t += 12.5
    wall.t += 12.5
    fids = [
        pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        (pynvml.NVML_FI_DEV_PERF_POLICY_POWER, 0),
        pynvml.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST,
        pynvml.NVML_FI_DEV_MEMORY_TEMP,
        pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT,
    ]
    energy, power_viol, sync_viol, mem_temp, nvlink = fake.nvmlDeviceGetFieldValues(h, fids)
    assert energy.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG and energy.nvmlReturn == pynvml.NVML_SUCCESS
    assert energy.value.ullVal == fake.nvmlDeviceGetTotalEnergyConsumption(h)
    assert energy.timestamp == 7_012_500_000  # µs on the wall clock
    assert power_viol.value.ullVal == 2_500_000_000 == fake.nvmlDeviceGetViolationStatus(h, 0).violationTime
    assert sync_viol.value.ullVal == 0 and mem_temp.value.ullVal == 61
    assert nvlink.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED  # not scripted: not supported, never 0
    with pytest.raises(AttributeError):
        _ = energy.value.uiVal  # only the member matching valueType is set


def test_a_gpu_without_an_energy_counter_has_no_energy_field() -> None:
    fake, h = one_gpu(Clock(), unsupported=frozenset({"nvmlDeviceGetTotalEnergyConsumption"}))
    assert field(fake, h, pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION).nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    fake, h = one_gpu(Clock(), unsupported_fields=frozenset({pynvml.NVML_FI_DEV_POWER_INSTANT}))
    assert field(fake, h, pynvml.NVML_FI_DEV_POWER_INSTANT).nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert field(fake, h, pynvml.NVML_FI_DEV_POWER_AVERAGE).nvmlReturn == pynvml.NVML_SUCCESS


def test_temperature_old_and_new_calls_and_minor_number() -> None:
    fake, h = one_gpu(Clock(), minor_number=3)
    assert fake.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU) == 50
    assert fake.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 50  # deprecated, still answers
    with pytest.raises(pynvml.NVMLError) as err:
        fake.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU, version=7)
    assert err.value.value == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    assert fake.nvmlDeviceGetMinorNumber(h) == 3
    fake, h = one_gpu(Clock())
    assert fake.nvmlDeviceGetMinorNumber(h) == 0


def test_series_never_given_is_not_supported_not_zero() -> None:
    fake, h = one_gpu(Clock(), points=[TracePoint(0, util_pct=10, power_w=50)])
    for call in (
        lambda: fake.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        lambda: fake.nvmlDeviceGetMemoryInfo(h),
        lambda: fake.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()


def test_violation_counters_and_reason_bits() -> None:
    clock = Clock()
    fake, h = one_gpu(clock)
    clock.t += 12.5
    assert fake.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_POWER).violationTime == 2_500_000_000
    assert fake.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_THERMAL).violationTime == 2_500_000_000
    assert fake.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_SYNC_BOOST).violationTime == 0
    bits = fake.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert bits == pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonSwThermalSlowdown
    assert fake.nvmlDeviceGetCurrentClocksThrottleReasons(h) == bits  # the deprecated name answers the same
    pts = [TracePoint(0, throttle=("hw_thermal",))]
    fake, h = one_gpu(clock, points=pts)
    clock.t += 2
    assert fake.nvmlDeviceGetCurrentClocksEventReasons(h) == pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert fake.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_THERMAL).violationTime == 2_000_000_000
    with pytest.raises(ValueError, match="unknown throttle reason"):
        one_gpu(clock, points=[TracePoint(0, throttle=("powr",))])


# -- processes ------------------------------------------------------------------------------------
def test_memory_v2_v1_and_processes_of_a_shared_gpu() -> None:
    pts = [TracePoint(0, mem_used_b=5_000, procs={"run": (3_000, 60.0), 4242: (2_000, 30.0)})]
    fake, h = one_gpu(Clock(), points=pts, memory_reserved_b=100, memory_total_b=10_000)
    fake.run_pids = {77, 99}
    m2 = fake.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert (m2.used, m2.reserved, m2.free, m2.total) == (5_000, 100, 4_900, 10_000)
    assert fake.nvmlDeviceGetMemoryInfo(h).used == 5_100  # v1 counts reserved memory as used
    procs = {p.pid: p.usedGpuMemory for p in fake.nvmlDeviceGetComputeRunningProcesses(h)}
    assert procs == {77: 3_000, 4242: 2_000}  # "run" is the smallest of the run's pids
    assert {p.gpuInstanceId for p in fake.nvmlDeviceGetComputeRunningProcesses(h)} == {0xFFFFFFFF}  # no MIG
    assert fake.nvmlDeviceGetGraphicsRunningProcesses(h) == []
    assert fake.nvmlDeviceGetMPSComputeRunningProcesses(h) == []  # no MPS server scripted
    util = {s.pid: s.smUtil for s in fake.nvmlDeviceGetProcessUtilization(h, 0)}
    assert util == {77: 60, 4242: 30}
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetProcessUtilization(h, 10**18)


def test_in_a_pid_namespace_the_driver_reports_host_pids() -> None:
    pts = [TracePoint(0, procs={"run": (3_000, 60.0), 10: (1_000, 5.0)})]  # 10: someone else's host pid
    fake, h = one_gpu(Clock(), points=pts, host_pid_offset=2)
    fake.run_pids = {10, 12}  # the run and its child, as the caller's namespace numbers them
    listed = sorted((p.pid, p.usedGpuMemory) for p in fake.nvmlDeviceGetComputeRunningProcesses(h))
    # the run's process (10 here) is host pid 12, which the caller's namespace gives to the child, and the
    # foreign process's host pid 10 is the run's own number here: nvidia-docker #1483
    assert listed == [(10, 1_000), (12, 3_000)]
    sampled = sorted((s.pid, s.smUtil) for s in fake.nvmlDeviceGetProcessUtilization(h, 0))
    assert sampled == [(10, 5), (12, 60)]


def test_driver_560_translates_process_lists_but_not_utilisation_samples() -> None:
    pts = [TracePoint(0, procs={"run": (3_000, 60.0)})]
    fake, h = one_gpu(Clock(), points=pts, host_pid_offset=645_076, pid_translation="lists")
    fake.run_pids = {324}
    assert [p.pid for p in fake.nvmlDeviceGetComputeRunningProcesses(h)] == [324]  # HAMi-core #112
    assert [s.pid for s in fake.nvmlDeviceGetProcessUtilization(h, 0)] == [645_400]


def test_process_utilisation_quirks_seen_in_the_wild() -> None:
    clock = Clock()
    pts = [TracePoint(0, util_pct=50, procs={"run": (3_000, 60.0), 666: (1_000, None)})]
    fake, h = one_gpu(clock, points=pts, putil_quirks=frozenset({"stale", "over_100"}))
    fake.run_pids = {5}
    first = fake.nvmlDeviceGetProcessUtilization(h, 0)
    newest = max(s.timeStamp for s in first)
    again = fake.nvmlDeviceGetProcessUtilization(h, newest)  # stale: old samples come back
    assert {s.timeStamp for s in again if s.pid == 5} == {newest}
    zombie = [s for s in again if s.pid == 666]
    assert zombie and zombie[0].smUtil > 100  # nvtop #110
    assert any(s.pid == 0 and s.timeStamp == 0 for s in again)
    fake, h = one_gpu(clock, points=pts)
    fake.run_pids = {5}
    assert [s.pid for s in fake.nvmlDeviceGetProcessUtilization(h, 0)] == [5]  # without quirks: real samples only


def test_unversioned_process_call_needs_the_v3_symbol() -> None:
    pts = [TracePoint(0, procs={"run": (3_000, 60.0)})]
    fake, h = one_gpu(Clock(), points=pts, unsupported=frozenset({"nvmlDeviceGetComputeRunningProcesses_v3"}))
    fake.run_pids = {5}
    with pytest.raises(pynvml.NVMLLibraryMismatchError):  # pynvml's throwOnVersionMismatch
        fake.nvmlDeviceGetComputeRunningProcesses(h)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        fake.nvmlDeviceGetComputeRunningProcesses_v3(h)
    assert [p.pid for p in fake.nvmlDeviceGetComputeRunningProcesses_v2(h)] == [5]


# -- MIG ------------------------------------------------------------------------------------------
def test_mig_slices() -> None:
    slices = [
        FakeGpu(
            "MIG-one", mig_profile="3g.40gb", memory_total_b=40 * 2**30, gpu_instance_id=2,
            points=[TracePoint(0, mem_used_b=7, util_pct=50, power_w=90, temp_c=40, procs={"run": (5, None)})],
        ),
        FakeGpu("MIG-two", mig_profile="3g.40gb", memory_total_b=40 * 2**30, compute_instance_id=1),
    ]  # fmt: skip
    fake, h = one_gpu(Clock(), mig=slices)
    fake.run_pids = {42}
    assert fake.nvmlDeviceGetMigMode(h) == [1, 1]
    assert fake.nvmlDeviceGetMaxMigDeviceCount(h) == 7
    mh = fake.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert fake.nvmlDeviceGetUUID(mh) == "MIG-one"
    assert fake.nvmlDeviceGetName(mh) == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    assert fake.nvmlDeviceGetMemoryInfo(mh, version=pynvml.nvmlMemory_v2).used == 7
    assert (fake.nvmlDeviceGetGpuInstanceId(mh), fake.nvmlDeviceGetComputeInstanceId(mh)) == (2, 0)
    two = fake.nvmlDeviceGetMigDeviceHandleByIndex(h, 1)
    assert (fake.nvmlDeviceGetGpuInstanceId(two), fake.nvmlDeviceGetComputeInstanceId(two)) == (2, 1)  # 1 + 1
    with pytest.raises(pynvml.NVMLError_NotSupported):  # not a MIG device handle
        fake.nvmlDeviceGetGpuInstanceId(h)
    (proc,) = fake.nvmlDeviceGetComputeRunningProcesses(mh)
    assert (proc.pid, proc.usedGpuMemory, proc.gpuInstanceId, proc.computeInstanceId) == (42, None, 2, 0)
    assert fake.nvmlDeviceGetArchitecture(mh) == pynvml.NVML_DEVICE_ARCH_AMPERE
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetMigDeviceHandleByIndex(h, 2)
    for call in (  # the slice's own trace has utilisation and power: NVML still answers only for the board
        lambda: fake.nvmlDeviceGetPowerUsage(mh),
        lambda: fake.nvmlDeviceGetTemperature(mh, pynvml.NVML_TEMPERATURE_GPU),
        lambda: fake.nvmlDeviceGetTotalEnergyConsumption(mh),
        lambda: fake.nvmlDeviceGetSamples(mh, UTIL, 0),
        lambda: fake.nvmlDeviceGetUtilizationRates(mh),
        lambda: fake.nvmlDeviceGetUtilizationRates(h),  # no utilisation in MIG mode
        lambda: fake.nvmlDeviceGetSamples(h, UTIL, 0),
        lambda: fake.nvmlDeviceGetProcessUtilization(h, 0),
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()
    assert field(fake, mh, pynvml.NVML_FI_DEV_POWER_INSTANT).nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert fake.nvmlDeviceGetPowerUsage(h) == 100_000  # the parent answers for the board
    assert fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByUUID("MIG-two")) == "MIG-two"


# -- failures -------------------------------------------------------------------------------------
def test_one_failing_function_does_not_break_the_others() -> None:
    clock = Clock()
    failing = (
        Failing("nvmlDeviceGetTotalEnergyConsumption", 5.0, 8.0),
        Failing(pynvml.NVML_FI_DEV_POWER_INSTANT),
    )
    fake, h = one_gpu(clock, failing=failing)
    clock.t += 6
    with pytest.raises(pynvml.NVMLError_Unknown):
        fake.nvmlDeviceGetTotalEnergyConsumption(h)
    assert fake.nvmlDeviceGetPowerUsage(h) == 100_000 and fake.nvmlDeviceGetTemperature(h, 0) == 50
    assert samples(fake, h)
    instant, energy = fake.nvmlDeviceGetFieldValues(
        h, [pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]
    )
    assert instant.nvmlReturn == pynvml.NVML_ERROR_UNKNOWN and energy.nvmlReturn == pynvml.NVML_SUCCESS
    clock.t += 3  # the window is over
    assert fake.nvmlDeviceGetTotalEnergyConsumption(h) > 0


def test_gpu_lost_window_and_stale_handles() -> None:
    clock = Clock()
    fake, h = one_gpu(clock, lost=[(5.0, 8.0)])
    clock.t += 6
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetPowerUsage(h)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetHandleByUUID("GPU-a")
    clock.t += 3
    with pytest.raises(pynvml.NVMLError_GpuIsLost):  # the old handle stays lost
        fake.nvmlDeviceGetPowerUsage(h)
    assert fake.nvmlDeviceGetPowerUsage(fake.nvmlDeviceGetHandleByUUID("GPU-a")) == 100_000


def test_driver_reload_needs_reinit() -> None:
    clock = Clock()
    fake = FakeNvml([FakeGpu("GPU-a", points=[TracePoint(0, power_w=1)])], clock=clock, reloads=[(5, 7)])
    fake.start = clock.t
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    clock.t += 6
    with pytest.raises(pynvml.NVMLError_Unknown):
        fake.nvmlDeviceGetPowerUsage(h)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        fake.nvmlInit()
    clock.t += 2
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    with pytest.raises(pynvml.NVMLError_Uninitialized):  # handles from before the reload
        fake.nvmlDeviceGetPowerUsage(h)
    assert fake.nvmlDeviceGetPowerUsage(fake.nvmlDeviceGetHandleByIndex(0)) == 1000


def test_ctypes_structs_are_pynvmls() -> None:
    clock = Clock()
    fake = FakeNvml(
        [FakeGpu("GPU-a", points=[TracePoint(0, util_pct=10, mem_used_b=1, power_w=90)])],
        clock=clock,
        ctypes_structs=True,
    )
    fake.start = clock.t
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    clock.t += 1
    assert isinstance(fake.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2), pynvml.c_nvmlMemory_v2_t)
    assert isinstance(fake.nvmlDeviceGetSamples(h, UTIL, 0)[1][0], pynvml.c_nvmlSample_t)
    assert fake.nvmlDeviceGetPciInfo(h).busId == "00000000:07:00.0"  # pynvml decodes char arrays
    (fv,) = fake.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_POWER_INSTANT])
    assert isinstance(fv, pynvml.c_nvmlFieldValue_t) and fv.value.uiVal == 90_000
