"""The scripted NVML behaves like pynvml where the collector depends on it."""

from __future__ import annotations

import itertools

import pynvml
import pytest

from gpuledger.collect.fake_nvml import FakeGpu, FakeNvml, TracePoint


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def one_gpu(clock: Clock, **kw) -> tuple[FakeNvml, object]:
    points = kw.pop(
        "points",
        [
            TracePoint(0, util_pct=40, mem_used_b=2_000, power_w=100, temp_c=50, sm_clock_mhz=1400),
            TracePoint(10, util_pct=100, power_w=300, throttle=("power", "thermal")),
        ],
    )
    fake = FakeNvml([FakeGpu("GPU-a", points=points, **kw)], clock=clock, start=clock.t)
    fake.nvmlInit()
    return fake, fake.nvmlDeviceGetHandleByIndex(0)


def test_constants_and_error_classes_are_pynvmls() -> None:
    assert FakeNvml.NVML_GPU_UTILIZATION_SAMPLES == pynvml.NVML_GPU_UTILIZATION_SAMPLES
    assert FakeNvml.NVMLError_NotSupported is pynvml.NVMLError_NotSupported
    assert FakeNvml.nvmlMemory_v2 == pynvml.nvmlMemory_v2
    fake, h = one_gpu(Clock(), unsupported=frozenset({"nvmlDeviceGetTemperature"}))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)


def test_uninitialised_and_missing_library() -> None:
    fake = FakeNvml([FakeGpu("GPU-a")], clock=Clock())
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        FakeNvml([], clock=Clock(), library_missing=True).nvmlInit()


def test_sample_buffer_returns_entries_newer_than_the_timestamp() -> None:
    clock = Clock()
    fake, h = one_gpu(clock)
    clock.t += 1.0
    vtype, samples = fake.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert vtype == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    ts = [s.timeStamp for s in samples]
    assert ts == sorted(ts) and all(isinstance(t, int) for t in ts)
    assert ts[-1] <= 1001 * 1_000_000 and all(b - a == 166_667 for a, b in itertools.pairwise(ts))
    assert {s.sampleValue.uiVal for s in samples} == {40}
    _, newer = fake.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, ts[-3])
    assert [s.timeStamp for s in newer] == ts[-2:]
    with pytest.raises(pynvml.NVMLError_NotFound):  # nothing newer yet
        fake.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, ts[-1])
    clock.t += 1000
    _, full = fake.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, ts[-1])
    assert len(full) == 120  # the buffer keeps the last buffer_len samples


def test_sample_straddling_a_step_is_the_mean() -> None:
    clock = Clock(0.0)
    pts = [TracePoint(0, util_pct=0), TracePoint(0.5, util_pct=100)]
    fake, h = one_gpu(clock, points=pts, sample_period_s=1.0)
    clock.t = 1.0
    _, samples = fake.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert samples[-1].timeStamp == 1_000_000 and samples[-1].sampleValue.uiVal == 50
    assert fake.nvmlDeviceGetUtilizationRates(h).gpu == 50


def test_series_never_given_is_not_supported_not_zero() -> None:
    fake, h = one_gpu(Clock(), points=[TracePoint(0, util_pct=10, power_w=50)])
    for call in (
        lambda: fake.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        lambda: fake.nvmlDeviceGetMemoryInfo(h),
        lambda: fake.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()


def test_energy_counter_integrates_power_wraps_and_resets() -> None:
    clock = Clock()
    fake, h = one_gpu(clock)
    e0 = fake.nvmlDeviceGetTotalEnergyConsumption(h)
    clock.t += 12
    assert fake.nvmlDeviceGetTotalEnergyConsumption(h) - e0 == 10 * 100_000 + 2 * 300_000  # mJ
    assert fake.nvmlDeviceGetPowerUsage(h) == 300_000  # mW

    clock = Clock()
    fake, h = one_gpu(clock, energy_offset_mj=(1 << 64) - 50_000)
    clock.t += 1
    assert fake.nvmlDeviceGetTotalEnergyConsumption(h) == 50_000  # wrapped past 2**64

    clock = Clock()
    pts = [TracePoint(0, power_w=100, energy_j=5_000), TracePoint(2, energy_j=10)]  # reset at t=2
    fake, h = one_gpu(clock, points=pts)
    clock.t += 1
    assert fake.nvmlDeviceGetTotalEnergyConsumption(h) == 5_100_000
    clock.t += 2
    assert fake.nvmlDeviceGetTotalEnergyConsumption(h) == 110_000


def test_violation_counters_and_reason_bits() -> None:
    clock = Clock()
    fake, h = one_gpu(clock)
    clock.t += 12.5
    power = fake.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_POWER)
    assert power.violationTime == 2_500_000_000  # ns
    assert fake.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_SYNC_BOOST).violationTime == 0
    bits = fake.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert bits & pynvml.nvmlClocksEventReasonSwPowerCap and bits & pynvml.nvmlClocksEventReasonSwThermalSlowdown


def test_memory_v2_v1_and_processes_of_a_shared_gpu() -> None:
    pts = [TracePoint(0, mem_used_b=5_000, procs={"run": (3_000, 60.0), 4242: (2_000, 30.0)})]
    fake, h = one_gpu(Clock(), points=pts, memory_reserved_b=100, memory_total_b=10_000)
    fake.run_pids = {77, 99}
    m2 = fake.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert (m2.used, m2.reserved, m2.free, m2.total) == (5_000, 100, 4_900, 10_000)
    assert fake.nvmlDeviceGetMemoryInfo(h).used == 5_100  # v1 counts reserved memory as used
    procs = {p.pid: p.usedGpuMemory for p in fake.nvmlDeviceGetComputeRunningProcesses(h)}
    assert procs == {77: 3_000, 4242: 2_000}  # "run" is the smallest of the run's pids
    util = {s.pid: s.smUtil for s in fake.nvmlDeviceGetProcessUtilization(h, 0)}
    assert util == {77: 60, 4242: 30}
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetProcessUtilization(h, 10**18)


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


def test_mig_slices() -> None:
    slices = [
        FakeGpu("MIG-one", mig_profile="3g.40gb", memory_total_b=40 * 2**30, points=[TracePoint(0, mem_used_b=7)]),
        FakeGpu("MIG-two", mig_profile="3g.40gb", memory_total_b=40 * 2**30),
    ]
    fake, h = one_gpu(Clock(), mig=slices)
    assert fake.nvmlDeviceGetMigMode(h) == [1, 1]
    assert fake.nvmlDeviceGetMaxMigDeviceCount(h) == 7
    mh = fake.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert fake.nvmlDeviceGetUUID(mh) == "MIG-one"
    assert fake.nvmlDeviceGetName(mh) == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    assert fake.nvmlDeviceGetMemoryInfo(mh, version=pynvml.nvmlMemory_v2).used == 7
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetMigDeviceHandleByIndex(h, 2)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetPowerUsage(mh)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # no utilisation in MIG mode
        fake.nvmlDeviceGetUtilizationRates(h)
    assert fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByUUID("MIG-two")) == "MIG-two"


def test_ctypes_structs_are_pynvmls() -> None:
    clock = Clock()
    fake = FakeNvml(
        [FakeGpu("GPU-a", points=[TracePoint(0, util_pct=10, mem_used_b=1)])], clock=clock, ctypes_structs=True
    )
    fake.start = clock.t
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    clock.t += 1
    assert isinstance(fake.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2), pynvml.c_nvmlMemory_v2_t)
    assert isinstance(fake.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)[1][0], pynvml.c_nvmlSample_t)
    assert fake.nvmlDeviceGetPciInfo(h).busId == "00000000:07:00.0"  # pynvml decodes char arrays
