"""The real NvmlCollector, run on the scripted NVML."""

from __future__ import annotations

import random

import pynvml
import pytest

from gpuledger.collect.base import CollectorUnavailable
from gpuledger.collect.fake_nvml import FakeGpu, FakeNvml, TracePoint
from gpuledger.collect.gpus import open_gpu_collector
from gpuledger.collect.nvml import NvmlCollector
from gpuledger.core.model import ENERGY_COUNTER, ENERGY_POWER, UTIL_INSTANT, UTIL_SAMPLES

T0 = 1_700_000_000.0
PERIOD_US = 166_667
GiB = 2**30


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def busy_truth(points: list[TracePoint], a: float, b: float) -> float:
    """Exact busy-seconds of a stepped utilisation trace over (a, b] (trace seconds)."""
    total = 0.0
    for i, p in enumerate(points):
        end = points[i + 1].t if i + 1 < len(points) else float("inf")
        lo, hi = max(a, p.t), min(b, end)
        if hi > lo:
            total += (p.util_pct or 0) / 100 * (hi - lo)
    return total


def standard_points(n: int = 60, seed: int = 1) -> list[TracePoint]:
    rnd = random.Random(seed)
    return [
        TracePoint(
            float(t),
            util_pct=rnd.choice([0, 7, 35, 90, 100]),
            mem_used_b=(10 + t) * GiB // 10,
            power_w=rnd.uniform(80, 390),
            temp_c=40 + t % 30,
            sm_clock_mhz=1410,
            mem_clock_mhz=1593,
            throttle=("power",) if t % 9 == 0 else (),
            procs={"run": (GiB, 80.0), 4242: (3 * GiB, 15.0)},
        )
        for t in range(n)
    ]


def make(gpus: list[FakeGpu], visible: str | None = None, **kw) -> tuple[NvmlCollector, FakeNvml, Clock]:
    clock = Clock()
    fake = FakeNvml(gpus, clock=clock, start=clock.t, **kw)
    return NvmlCollector(nvml=fake, visible=visible, clock=clock), fake, clock


def run(col: NvmlCollector, clock: Clock, until: float, step: float = 1.0, pids=frozenset({77})):
    """Read every ``step`` seconds from now until ``until`` (trace seconds); all ticks, all events."""
    ticks, events = [], []
    while True:
        r = col.read(set(pids), clock.t)
        ticks += r.ticks
        events += r.events
        if clock.t - T0 >= until:
            return ticks, events
        clock.t += step


def test_identity() -> None:
    points = [TracePoint(0, mem_used_b=GiB)]
    col, _, _ = make([FakeGpu("GPU-a", points=points), FakeGpu("GPU-b", points=points, name="NVIDIA L4")])
    a, b = col.devices()
    assert (a.index, a.uuid, a.name, a.nvml_index) == (0, "GPU-a", "NVIDIA A100-SXM4-80GB", 0)
    assert (a.pci_bus_id, a.memory_total_b, a.power_limit_w) == ("00000000:07:00.0", 80 * GiB, 400.0)
    assert (a.driver_version, a.cuda_version, a.mig_mode, a.source) == ("550.54.15", "12.4", "disabled", "nvml")
    assert b.name == "NVIDIA L4" and b.index == 1


def test_first_read_primes_then_ticks_tile_the_time() -> None:
    col, _, clock = make([FakeGpu("GPU-a", points=standard_points())])
    assert col.read({77}, clock.t).ticks == []
    ticks, _ = run(col, clock, 5)
    assert [(t.t0 - T0, t.t1 - T0) for t in ticks] == [(i, i + 1.0) for i in range(5)]


def test_busy_from_samples_sums_to_ground_truth() -> None:
    points = standard_points()
    col, _, clock = make([FakeGpu("GPU-a", points=points)])
    rnd = random.Random(3)
    ticks = []
    col.read({77}, clock.t)
    while clock.t - T0 < 55:
        clock.t += rnd.uniform(0.3, 2.5)  # irregular ticks change nothing in the sum
        ticks += col.read({77}, clock.t).ticks
    assert {t.util_method for t in ticks} == {UTIL_SAMPLES}
    busy = sum(t.busy_s for t in ticks)
    end_us = int((clock.t - T0) * 1e6) // PERIOD_US * PERIOD_US  # last sample the collector saw
    assert busy == pytest.approx(busy_truth(points, 0, end_us / 1e6), abs=1e-3)
    assert abs(busy - busy_truth(points, 0, clock.t - T0)) <= PERIOD_US / 1e6  # lags at most a period
    assert max(t.util_max_pct for t in ticks) == 100.0


def test_busy_falls_back_to_instant_utilisation() -> None:
    points = [TracePoint(0, util_pct=30), TracePoint(3, util_pct=80)]
    gpu = FakeGpu("GPU-a", points=points, unsupported=frozenset({"nvmlDeviceGetSamples"}))
    col, fake, clock = make([gpu])
    ticks, _ = run(col, clock, 6, step=2.0)
    assert {t.util_method for t in ticks} == {UTIL_INSTANT}
    assert [t.busy_s for t in ticks] == pytest.approx([0.6, 1.6, 1.6])  # util at read time x tick length
    assert fake.calls["nvmlDeviceGetSamples"] == 1  # not asked again


def test_not_supported_is_absent_not_zero_and_not_asked_again() -> None:
    gpu = FakeGpu(
        "GPU-a",
        points=[TracePoint(0, util_pct=50, mem_used_b=GiB)],  # no power, temperature or clocks at all
        unsupported=frozenset({"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetProcessUtilization"}),
    )
    col, fake, clock = make([gpu])
    ticks, events = run(col, clock, 10)
    assert events == []
    for t in ticks:
        assert t.power_w is None and t.energy_j is None and t.energy_method is None
        assert t.temp_c is None and t.sm_clock_mhz is None and t.proc_sm_util_pct is None
        assert t.mem_used_b == GiB and t.busy_s is not None
    for fn in ("nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption"):
        assert fake.calls[fn] == 1, fn


def test_passing_errors_are_one_event_and_read_never_raises() -> None:
    gpu = FakeGpu("GPU-a", points=standard_points(), errors={"nvmlDeviceGetTemperature": pynvml.NVML_ERROR_TIMEOUT})
    col, fake, clock = make([gpu])

    def broken(*_args):
        raise RuntimeError("a bug in a query")

    fake.nvmlDeviceGetClockInfo = broken  # type: ignore[method-assign]
    col._f_clock = broken  # the collector binds functions once
    ticks, events = run(col, clock, 5)
    assert len(ticks) == 5 and all(t.temp_c is None and t.sm_clock_mhz is None for t in ticks)
    assert all(t.busy_s is not None and t.energy_j is not None for t in ticks)
    assert sorted(e.payload["series"] for e in events) == ["mem_clock", "sm_clock", "temp"]
    assert {e.kind for e in events} == {"sampler_error"}
    assert fake.calls["nvmlDeviceGetTemperature"] == 5  # passing errors are asked again, every tick


def test_energy_counter_and_power_fallback() -> None:
    points = standard_points()
    col, _, clock = make([FakeGpu("GPU-a", points=points)])
    ticks, _ = run(col, clock, 30)
    truth = sum(p.power_w for p in points[:30])  # stepped power, 1 s per point
    assert {t.energy_method for t in ticks} == {ENERGY_COUNTER}
    assert sum(t.energy_j for t in ticks) == pytest.approx(truth, abs=0.01)  # mJ resolution

    flat = [TracePoint(0, power_w=250.0)]
    gpu = FakeGpu("GPU-a", points=flat, unsupported=frozenset({"nvmlDeviceGetTotalEnergyConsumption"}))
    col, _, clock = make([gpu])
    ticks, _ = run(col, clock, 10, step=0.5)
    assert {t.energy_method for t in ticks} == {ENERGY_POWER}
    assert sum(t.energy_j for t in ticks) == pytest.approx(2500.0)
    assert ticks[-1].power_w == 250.0


def test_energy_counter_wrap_and_reset() -> None:
    points = [TracePoint(0, power_w=300.0)]
    col, _, clock = make([FakeGpu("GPU-a", points=points, energy_offset_mj=(1 << 64) - 1_000_000)])
    ticks, events = run(col, clock, 10)
    assert [t.energy_j for t in ticks] == pytest.approx([300.0] * 10) and events == []  # wrapped at ~3.3 s

    points = [TracePoint(0, power_w=100.0, energy_j=9_000.0), TracePoint(5, energy_j=1.0)]  # reset at t=5
    col, _, clock = make([FakeGpu("GPU-a", points=points)])
    ticks, events = run(col, clock, 8)
    methods = [t.energy_method for t in ticks]
    assert methods == [ENERGY_COUNTER] * 4 + [ENERGY_POWER] + [ENERGY_COUNTER] * 3
    assert ticks[4].energy_j == pytest.approx(100.0)
    assert [e.kind for e in events] == ["sampler_error"] and "reset" in events[0].message


def test_throttle_from_violation_counters_is_exact() -> None:
    points = [TracePoint(0, throttle=()), TracePoint(5, throttle=("power",)), TracePoint(8.5, throttle=())]
    col, _, clock = make([FakeGpu("GPU-a", points=points)])
    ticks, _ = run(col, clock, 12)
    assert sum(t.throttle_s["power"] for t in ticks) == pytest.approx(3.5)
    assert ticks[8].throttle_s["power"] == pytest.approx(0.5)  # (8, 9]
    assert set(ticks[0].throttle_s) == {"power", "thermal", "sync_boost", "board_limit", "low_util", "reliability"}


def test_throttle_from_reason_bits_when_counters_are_missing() -> None:
    points = [TracePoint(0, throttle=()), TracePoint(5, throttle=("power", "hw_slowdown")), TracePoint(8.5)]
    points[2].throttle = ()
    gpu = FakeGpu("GPU-a", points=points, unsupported=frozenset({"nvmlDeviceGetViolationStatus"}))
    col, _, clock = make([gpu])
    ticks, _ = run(col, clock, 12)
    # the reasons read at the end of each tick own the whole tick: (4,5] ... (7,8] -> 4 s
    assert sum(t.throttle_s["power"] for t in ticks) == pytest.approx(4.0)
    assert sum(t.throttle_s["hw_slowdown"] for t in ticks) == pytest.approx(4.0)
    assert sum(t.throttle_s["thermal"] for t in ticks) == 0.0


def test_memory_v2_then_v1() -> None:
    points = [TracePoint(0, mem_used_b=4 * GiB)]
    col, _, clock = make([FakeGpu("GPU-a", points=points, memory_reserved_b=GiB // 2)])
    t = run(col, clock, 1)[0][0]
    assert (t.mem_used_b, t.mem_reserved_b) == (4 * GiB, GiB // 2)
    gpu = FakeGpu(
        "GPU-a", points=points, memory_reserved_b=GiB // 2, unsupported=frozenset({"nvmlDeviceGetMemoryInfo_v2"})
    )
    col, _, clock = make([gpu])
    t = run(col, clock, 1)[0][0]
    assert (t.mem_used_b, t.mem_reserved_b) == (4 * GiB + GiB // 2, None)  # v1 counts reserved as used
    assert col.devices()[0].memory_total_b == 80 * GiB


def test_shared_gpu_counts_only_the_runs_processes() -> None:
    procs = {77: (2 * GiB, 55.0), 78: (GiB, 20.0), 4242: (30 * GiB, 25.0)}
    col, _, clock = make([FakeGpu("GPU-a", points=[TracePoint(0, util_pct=100, mem_used_b=33 * GiB, procs=procs)])])
    t = run(col, clock, 2, pids={77, 78, 90})[0][-1]
    assert t.proc_mem_b == 3 * GiB and t.mem_used_b == 33 * GiB
    assert t.proc_sm_util_pct == pytest.approx(75.0)
    t = run(col, clock, 4, pids={5})[0][-1]
    assert t.proc_mem_b == 0 and t.proc_sm_util_pct == 0.0  # not on this GPU: a true zero


def test_cuda_visible_devices_by_index_and_uuid() -> None:
    gpus = [FakeGpu(f"GPU-{c}{c}{c}", points=standard_points()) for c in "abc"]
    col, _, clock = make(gpus, visible="2,0")
    assert [(d.index, d.uuid, d.nvml_index) for d in col.devices()] == [(0, "GPU-ccc", 2), (1, "GPU-aaa", 0)]
    ticks, _ = run(col, clock, 2)
    assert {t.uuid for t in ticks} == {"GPU-ccc", "GPU-aaa"}

    gpus = [FakeGpu(f"GPU-{c}{c}{c}", points=standard_points()) for c in "abc"]
    col, _, _ = make(gpus, visible="GPU-bb")
    assert [(d.index, d.uuid) for d in col.devices()] == [(0, "GPU-bbb")]
    gpus = [FakeGpu(f"GPU-{c}{c}{c}") for c in "abc"]
    assert make(gpus, visible="")[0].devices() == []


def test_mig_slice_identity_and_usage() -> None:
    slices = [
        FakeGpu("MIG-s0", mig_profile="3g.40gb", memory_total_b=40 * GiB),
        FakeGpu(
            "MIG-s1",
            mig_profile="3g.40gb",
            memory_total_b=40 * GiB,
            points=[TracePoint(0, mem_used_b=9 * GiB, procs={77: (8 * GiB, None), 4242: (GiB, None)})],
        ),
    ]
    col, _, clock = make([FakeGpu("GPU-p", points=standard_points(), mig=slices)], visible="MIG-s1")
    (d,) = col.devices()
    assert (d.index, d.uuid, d.mig_parent_uuid, d.mig_profile, d.mig_mode) == (
        0,
        "MIG-s1",
        "GPU-p",
        "3g.40gb",
        "enabled",
    )
    assert d.memory_total_b == 40 * GiB and d.pci_bus_id == "00000000:07:00.0" and d.power_limit_w is None
    ticks, events = run(col, clock, 3)
    assert events == []
    assert all(t.mem_used_b == 9 * GiB and t.proc_mem_b == 8 * GiB for t in ticks)
    assert all(t.busy_s is None and t.energy_j is None and t.temp_c is None for t in ticks)  # parent-level: absent
    col, _, _ = make([FakeGpu("GPU-p", mig=slices), FakeGpu("GPU-q")])
    assert [d.uuid for d in col.devices()] == ["MIG-s0", "MIG-s1", "GPU-q"]


def test_gpu_lost_then_recovered_with_backoff() -> None:
    gpus = [FakeGpu("GPU-a", points=standard_points(), lost=[(9.5, 20.0)]), FakeGpu("GPU-b", points=standard_points())]
    col, fake, clock = make(gpus)
    ticks, events = run(col, clock, 30)
    assert [(e.kind, e.t - T0) for e in events] == [("gpu_lost", 10.0), ("gpu_recovered", 25.0)]
    assert events[0].payload["uuid"] == "GPU-a"
    assert fake.calls["nvmlDeviceGetHandleByUUID"] == 4  # retried at 11, 13, 17, 25: backoff 1, 2, 4, 8 s
    a = [t for t in ticks if t.uuid == "GPU-a"]
    assert [t.t1 - T0 for t in a] == [*range(1, 10), *range(26, 31)]  # no figures for the gap
    assert len([t for t in ticks if t.uuid == "GPU-b"]) == 30  # the other GPU is unaffected


def test_driver_reload_reinitialises_nvml() -> None:
    gpus = [FakeGpu("GPU-a", points=standard_points()), FakeGpu("GPU-b", points=standard_points())]
    col, fake, clock = make(gpus, reloads=[(9.5, 12.0)])
    ticks, events = run(col, clock, 25)
    kinds = [(e.t - T0, e.kind, e.payload["uuid"]) for e in events]
    # at 13 GPU-a finds NVML uninitialised; GPU-b restarts it and recovers; GPU-a follows at once
    assert kinds == [
        (10, "gpu_lost", "GPU-a"),
        (10, "gpu_lost", "GPU-b"),
        (13, "gpu_recovered", "GPU-b"),
        (14, "gpu_recovered", "GPU-a"),
    ]
    assert fake.calls["nvmlInit"] == 2  # once at start, once after the reload
    assert max(t.t1 for t in ticks) - T0 == 25


def test_works_on_real_pynvml_structs() -> None:
    col, _, clock = make([FakeGpu("GPU-a", points=standard_points())], ctypes_structs=True)
    ticks, events = run(col, clock, 5)
    assert events == [] and len(ticks) == 5
    assert col.devices()[0].pci_bus_id == "00000000:07:00.0"
    assert all(t.busy_s is not None and t.mem_used_b and t.throttle_s is not None for t in ticks)


def test_no_nvml_library_is_collector_unavailable() -> None:
    with pytest.raises(CollectorUnavailable, match="not loadable"):
        NvmlCollector(nvml=FakeNvml([], clock=Clock(), library_missing=True))


def test_open_gpu_collector_choices() -> None:
    missing = FakeNvml([], clock=Clock(), library_missing=True)
    col, why = open_gpu_collector({}, nvml=missing, which=lambda _: None)
    assert col is None
    assert why == (
        "no NVIDIA driver found (libnvidia-ml.so not loadable and nvidia-smi not on PATH): "
        "GPU figures are absent; host metrics were recorded"
    )
    fake = FakeNvml([FakeGpu("GPU-a"), FakeGpu("GPU-b")], clock=Clock())
    col, why = open_gpu_collector({"CUDA_VISIBLE_DEVICES": "1"}, nvml=fake)
    assert why is None and [d.uuid for d in col.devices()] == ["GPU-b"]
    col, why = open_gpu_collector({"CUDA_VISIBLE_DEVICES": "-1"}, nvml=FakeNvml([FakeGpu("GPU-a")], clock=Clock()))
    assert col is None and "CUDA_VISIBLE_DEVICES='-1'" in why

    smi_out = "0, GPU-x, Tesla T4, 00000000:00:1E.0, 535.1, 15360, 100, 30.1, 70.0, 40, 300, 5000, 3, Disabled, 0x1\n"
    col, why = open_gpu_collector(
        {}, nvml=missing, which=lambda _: "/usr/bin/nvidia-smi", smi_run=lambda argv, t: smi_out
    )
    assert why is None and col.devices()[0].source == "nvidia-smi"


def test_real_pynvml_without_a_driver_says_so() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(CollectorUnavailable, match="libnvidia-ml"):
        NvmlCollector()
    col, why = open_gpu_collector({}, which=lambda _: None)
    assert col is None and why.startswith("no NVIDIA driver found")


def test_a_passing_error_neither_loses_nor_double_counts() -> None:
    points = standard_points()
    gpu = FakeGpu("GPU-a", points=points)
    col, _, clock = make([gpu])
    ticks, _ = run(col, clock, 4)
    gpu.errors.update(
        {
            "nvmlDeviceGetSamples": pynvml.NVML_ERROR_TIMEOUT,
            "nvmlDeviceGetTotalEnergyConsumption": pynvml.NVML_ERROR_TIMEOUT,
        }
    )
    clock.t += 1
    bad = col.read({77}, clock.t)
    gpu.errors.clear()
    more, _ = run(col, clock, 12)
    (b,) = bad.ticks
    assert b.busy_s is None and b.util_method is None  # unknown for this tick ...
    assert (b.energy_method, b.energy_j) == (
        ENERGY_POWER,
        pytest.approx((points[4].power_w + points[5].power_w) / 2, abs=0.01),
    )
    k4, k6 = 4_000_000 // PERIOD_US, 6_000_000 // PERIOD_US  # ... the next tick covers both spans from the buffer
    assert more[0].busy_s == pytest.approx(busy_truth(points, k4 * PERIOD_US / 1e6, k6 * PERIOD_US / 1e6), abs=1e-4)
    busy = sum(t.busy_s for t in ticks + more)
    end_us = 12_000_000 // PERIOD_US * PERIOD_US
    assert busy == pytest.approx(busy_truth(points, 0, end_us / 1e6), abs=1e-3)
    assert [t.energy_method for t in more[:2]] == [ENERGY_POWER, ENERGY_COUNTER]  # re-based, then exact again


def test_mig_slice_lost_and_found_by_uuid() -> None:
    slices = [FakeGpu("MIG-s0", mig_profile="1g.10gb", points=[TracePoint(0, mem_used_b=GiB)])]
    col, _, clock = make([FakeGpu("GPU-p", mig=slices, lost=[(2.5, 4.0)])], visible="MIG-s0")
    ticks, events = run(col, clock, 8)
    assert [e.kind for e in events] == ["gpu_lost", "gpu_recovered"]
    assert all(t.mem_used_b == GiB for t in ticks) and ticks[-1].t1 - T0 == 8


def test_violation_counters_are_skipped_while_nothing_throttles_but_nothing_is_lost() -> None:
    # a 0.4 s power cap between two reads: the reason bits are clear at both reads
    points = [TracePoint(0, throttle=()), TracePoint(3.2, throttle=("power",)), TracePoint(3.6, throttle=())]
    col, fake, clock = make([FakeGpu("GPU-a", points=points)])
    ticks, _ = run(col, clock, 25)
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 6 * 3  # at the prime and two sweeps, not every tick
    power = [t.throttle_s["power"] for t in ticks]
    assert sum(power) == pytest.approx(0.4)
    assert power.index(max(power)) == 9  # counted at the sweep, (9, 10]
