"""The real NvmlCollector, run on the scripted NVML: what each figure is and how it is measured.

Robustness against how hardware misbehaves (clock steps, lost samples, failing fields, containers)
is in test_nvml_robust.py; accuracy over random workloads in test_busy_accuracy.py.
"""

from __future__ import annotations

import math
import random

import pynvml
import pytest

from gpuledger.collect.base import CollectorUnavailable
from gpuledger.collect.fake_nvml import FakeGpu, FakeNvml, TracePoint
from gpuledger.collect.gpus import open_gpu_collector
from gpuledger.collect.nvml import NvmlCollector
from gpuledger.core.model import ENERGY_COUNTER, ENERGY_POWER, UTIL_INSTANT, UTIL_SAMPLES
from nvml_support import PERIOD_US, T0, Clock, GiB, busy_truth, ideal, make, run, standard_points

POLICIES = ("power", "thermal", "sync_boost", "board_limit", "low_util", "reliability")


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
    col, _, clock = make([ideal("GPU-a", points=points)])
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
    assert all(t.util_idle_s == 0 and t.util_unknown_s == 0 for t in ticks)  # a grid: nothing unsampled


def test_idle_time_the_driver_did_not_sample_is_recorded_as_idle() -> None:
    # a Hopper-class GPU stops sampling while idle: 20 s of work, 20 s idle, 20 s of work
    points = [TracePoint(0, util_pct=100), TracePoint(20, util_pct=0), TracePoint(40, util_pct=100)]
    col, _, clock = make([FakeGpu("GPU-a", name="NVIDIA H100 80GB HBM3", points=points)])
    ticks, _ = run(col, clock, 60)
    busy = sum(t.busy_s for t in ticks)
    assert abs(busy - 40.0) <= 0.2  # one sample period at most
    idle = [t.util_idle_s for t in ticks]
    assert sum(idle[22:38]) == pytest.approx(16.0, abs=0.2)  # counted tick by tick, where it happened
    assert all(t.busy_s <= t.t1 - t.t0 + 0.2 for t in ticks)
    assert {t.util_method for t in ticks} == {UTIL_SAMPLES}


def test_busy_falls_back_to_instant_utilisation() -> None:
    points = [TracePoint(0, util_pct=30), TracePoint(3, util_pct=80)]
    gpu = ideal("GPU-a", points=points, unsupported=frozenset({"nvmlDeviceGetSamples"}))
    col, fake, clock = make([gpu])
    ticks, _ = run(col, clock, 6, step=2.0)
    assert {t.util_method for t in ticks} == {UTIL_INSTANT}
    assert [t.busy_s for t in ticks] == pytest.approx([0.6, 1.6, 1.6])  # util at read time x tick length
    assert all(t.util_idle_s is None and t.util_unknown_s is None for t in ticks)
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
    for fn in ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage"):
        assert fake.calls[fn] == 1, fn


def test_a_failing_query_is_reported_once_then_dropped_alone() -> None:
    gpu = FakeGpu(
        "GPU-a",
        points=standard_points(),
        errors={"nvmlDeviceGetTemperatureV": pynvml.NVML_ERROR_TIMEOUT, "nvmlDeviceGetTemperature": 999},
    )
    col, fake, clock = make([gpu])

    def broken(*_args):
        raise RuntimeError("a bug in a query")

    fake.nvmlDeviceGetClockInfo = broken  # type: ignore[method-assign]
    col._f_clock = broken  # the collector binds functions once
    ticks, events = run(col, clock, 8)
    assert len(ticks) == 8 and all(t.temp_c is None and t.sm_clock_mhz is None for t in ticks)
    assert all(t.busy_s is not None and t.energy_j is not None and t.mem_used_b for t in ticks)
    errors = sorted(e.payload["series"] for e in events if not e.payload.get("dropped"))
    dropped = sorted(e.payload["series"] for e in events if e.payload.get("dropped"))
    assert errors == dropped == ["mem_clock", "sm_clock", "temp", "temp_v"]
    assert {e.kind for e in events} == {"sampler_error"}
    assert fake.calls["nvmlDeviceGetTemperatureV"] == fake.calls["nvmlDeviceGetTemperature"] == 3  # then no more


def test_temperature_comes_from_the_current_call_with_the_deprecated_one_as_fallback() -> None:
    points = [TracePoint(0, temp_c=61)]
    col, fake, clock = make([FakeGpu("GPU-a", points=points)])
    assert {t.temp_c for t in run(col, clock, 3)[0]} == {61.0}
    assert fake.calls["nvmlDeviceGetTemperature"] == 0
    old = FakeGpu("GPU-a", points=points, unsupported=frozenset({"nvmlDeviceGetTemperatureV"}))
    col, fake, clock = make([old])
    assert {t.temp_c for t in run(col, clock, 3)[0]} == {61.0}
    assert fake.calls["nvmlDeviceGetTemperatureV"] == 1


def test_energy_counter_and_power_fallback() -> None:
    points = standard_points()
    col, _, clock = make([ideal("GPU-a", points=points)])
    ticks, _ = run(col, clock, 30)
    truth = sum(p.power_w for p in points[:30])  # stepped power, 1 s per point
    assert {t.energy_method for t in ticks} == {ENERGY_COUNTER}
    assert sum(t.energy_j for t in ticks) == pytest.approx(truth, abs=0.01)  # mJ resolution

    col, _, clock = make([FakeGpu("GPU-a", points=points)])  # the counter moves every 100 ms
    ticks, _ = run(col, clock, 30)
    assert abs(sum(t.energy_j for t in ticks) - truth) <= 0.1 * 400  # at most one update late

    flat = [TracePoint(0, power_w=250.0)]
    gpu = ideal("GPU-a", points=flat, unsupported=frozenset({"nvmlDeviceGetTotalEnergyConsumption"}),
                unsupported_fields=frozenset({pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION}))  # fmt: skip
    col, _, clock = make([gpu])
    ticks, _ = run(col, clock, 10, step=0.5)
    assert {t.energy_method for t in ticks} == {ENERGY_POWER}
    assert sum(t.energy_j for t in ticks) == pytest.approx(2500.0)
    assert ticks[-1].power_w == 250.0


def test_power_integration_uses_instant_power_not_the_one_second_average() -> None:
    # Ampere+ averages GetPowerUsage over 1 s: a 100 -> 400 W step every 2 s is smeared; the
    # instantaneous field is not. Without an energy counter the integral must use the instant one.
    points = [TracePoint(float(t), power_w=400.0 if t % 4 < 2 else 100.0) for t in range(40)]
    no_counter = frozenset({pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION})
    gpu = FakeGpu("GPU-a", name="NVIDIA H100 80GB HBM3", points=points, unsupported_fields=no_counter,
                  unsupported=frozenset({"nvmlDeviceGetTotalEnergyConsumption"}))  # fmt: skip
    col, fake, clock = make([gpu])
    ticks, _ = run(col, clock, 36, step=0.25)
    assert {t.energy_method for t in ticks} == {ENERGY_POWER}
    assert sum(t.energy_j for t in ticks) == pytest.approx(36 * 250.0, rel=0.02)
    assert max(t.power_w for t in ticks) == 400.0
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 0  # the field answered


def test_energy_counter_wrap_and_reset() -> None:
    points = [TracePoint(0, power_w=300.0)]
    col, _, clock = make([ideal("GPU-a", points=points, energy_offset_mj=(1 << 64) - 1_000_000)])
    ticks, events = run(col, clock, 10)
    assert [t.energy_j for t in ticks] == pytest.approx([300.0] * 10) and events == []  # wrapped at ~3.3 s

    points = [TracePoint(0, power_w=100.0, energy_j=9_000.0), TracePoint(5, energy_j=1.0)]  # reset at t=5
    col, _, clock = make([ideal("GPU-a", points=points)])
    ticks, events = run(col, clock, 8)
    methods = [t.energy_method for t in ticks]
    assert methods == [ENERGY_COUNTER] * 4 + [ENERGY_POWER] + [ENERGY_COUNTER] * 3
    assert ticks[4].energy_j == pytest.approx(100.0)
    assert [e.kind for e in events] == ["sampler_error"] and "reset" in events[0].message


def test_throttle_from_violation_counters_is_exact_per_reason() -> None:
    points = [TracePoint(0, throttle=()), TracePoint(5, throttle=("power",)), TracePoint(8.5, throttle=()),
              TracePoint(10, throttle=("thermal",)), TracePoint(11.25, throttle=())]  # fmt: skip
    col, _, clock = make([ideal("GPU-a", points=points)])
    ticks, _ = run(col, clock, 14)
    assert sum(t.throttle_s["power"] for t in ticks) == pytest.approx(3.5)
    assert sum(t.throttle_s["thermal"] for t in ticks) == pytest.approx(1.25)  # power and thermal apart
    assert ticks[8].throttle_s["power"] == pytest.approx(0.5)  # (8, 9]
    assert set(ticks[0].throttle_s) == set(POLICIES)


def test_throttle_counters_fall_back_to_the_deprecated_call() -> None:
    points = [TracePoint(0, throttle=()), TracePoint(5, throttle=("power",)), TracePoint(8.5, throttle=())]
    gpu = ideal("GPU-a", points=points, unsupported_fields=frozenset(range(74, 80)))
    col, fake, clock = make([gpu])
    ticks, _ = run(col, clock, 12)
    assert sum(t.throttle_s["power"] for t in ticks) == pytest.approx(3.5)
    assert fake.calls["nvmlDeviceGetViolationStatus"] > 0


def test_throttle_from_reason_bits_when_counters_are_missing() -> None:
    points = [TracePoint(0, throttle=()), TracePoint(5, throttle=("power", "hw_slowdown")), TracePoint(8.5)]
    points[2].throttle = ()
    gpu = ideal("GPU-a", points=points, unsupported=frozenset({"nvmlDeviceGetViolationStatus"}),
                unsupported_fields=frozenset(range(74, 80)))  # fmt: skip
    col, _, clock = make([gpu])
    ticks, _ = run(col, clock, 12)
    # the reasons read at the end of each tick own the whole tick: (4,5] ... (7,8] -> 4 s
    assert sum(t.throttle_s["power"] for t in ticks) == pytest.approx(4.0)
    assert sum(t.throttle_s["hw_slowdown"] for t in ticks) == pytest.approx(4.0)
    assert sum(t.throttle_s["thermal"] for t in ticks) == 0.0


def test_violation_counters_are_read_where_intervals_end_and_each_interval_gets_its_own_time() -> None:
    # a 0.4 s power cap inside the first 5 s interval, between two ticks; a thermal slowdown from
    # 7.5 s to 12.5 s, across the end of the second interval (10 s)
    points = [TracePoint(0, util_pct=90, throttle=()), TracePoint(3.2, throttle=("power",)),
              TracePoint(3.6, throttle=()), TracePoint(7.5, throttle=("thermal",)),
              TracePoint(12.5, throttle=())]  # fmt: skip
    col, fake, clock = make([ideal("GPU-a", points=points)])
    reads: list[list[int]] = []
    fields = fake.nvmlDeviceGetFieldValues
    col._throttle._f_fields = lambda h, ids: (reads.append(list(ids)), fields(h, ids))[1]
    col.read({77}, clock.t)  # primes
    primed = len([ids for ids in reads if 74 in ids])
    reasons_before = fake.calls["nvmlDeviceGetCurrentClocksEventReasons"]
    intervals: list[list] = [[]]
    for i in range(1, 16):  # 1 s ticks; every fifth one ends an interval, as the recorder reads
        clock.t += 1.0
        closes = i % 5 == 0
        intervals[-1] += col.read({77}, clock.t, closes_interval=closes).ticks
        if closes:
            intervals.append([])
    sums = [{r: sum(t.throttle_s[r] for t in iv if t.throttle_s is not None) for r in ("power", "thermal")}
            for iv in intervals[:3]]  # fmt: skip
    assert sums[0] == pytest.approx({"power": 0.4, "thermal": 0.0})  # where it happened, not later
    assert sums[1] == pytest.approx({"power": 0.0, "thermal": 2.5})
    assert sums[2] == pytest.approx({"power": 0.0, "thermal": 2.5})
    # one counter query per interval, none in between, and no reason-bit query at all
    assert len([ids for ids in reads if 74 in ids]) - primed == 3
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == reasons_before
    read_at = [[t.throttle_s is not None for t in iv] for iv in intervals[:3]]
    assert read_at == [[False, False, False, False, True]] * 3  # only the tick that ends an interval


def read_in_intervals(col, clock, ticks: int, every: int = 5) -> list[list]:
    """1 s ticks after a priming read; every ``every``-th one ends an interval, as the recorder reads."""
    col.read({77}, clock.t)
    intervals: list[list] = [[]]
    for i in range(1, ticks + 1):
        clock.t += 1.0
        closes = i % every == 0
        intervals[-1] += col.read({77}, clock.t, closes_interval=closes).ticks
        if closes:
            intervals.append([])
    return intervals[:-1]


def test_the_energy_counter_is_read_where_intervals_end_and_power_at_every_tick() -> None:
    # The counter's query costs milliseconds of CPU on real GPUs (3.4 ms on an H200, power 0.03 ms;
    # BENCHMARKS.md): it is read where an interval ends, and each interval still gets its own energy.
    points = [TracePoint(float(t), power_w=100.0 + 20 * (t % 7)) for t in range(40)]
    col, fake, clock = make([ideal("GPU-a", points=points)])
    asked: list[list[int]] = []
    fields = fake.nvmlDeviceGetFieldValues
    col._f_fields = lambda h, ids: (asked.append(list(ids)), fields(h, ids))[1]
    intervals = read_in_intervals(col, clock, 15)
    energy = [math.fsum(t.energy_j for t in iv if t.energy_j is not None) for iv in intervals]
    assert energy == pytest.approx([sum(p.power_w for p in points[5 * k : 5 * k + 5]) for k in range(3)], abs=0.01)
    assert [[t.energy_method for t in iv] for iv in intervals] == [[None] * 4 + [ENERGY_COUNTER]] * 3
    counter = pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
    assert sum(counter in ids for ids in asked) == 1 + 3  # the priming read, then one per interval
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 0
    # power is still read at every tick (the instantaneous field), for peak power
    assert [t.power_w for iv in intervals for t in iv] == [points[i].power_w for i in range(1, 16)]


def test_a_broken_counter_reading_where_an_interval_ends_integrates_power_over_the_whole_interval() -> None:
    # The counter reads 10 MJ too high at the end of the first interval, then drops back (a reset):
    # both intervals integrate power over all their ticks, not over the closing tick alone.
    points = [TracePoint(0, power_w=300.0, energy_j=0.0), TracePoint(4.99, energy_j=1_497.0),
              TracePoint(4.995, energy_j=10_001_498.5), TracePoint(5.01, energy_j=1_503.0)]  # fmt: skip
    col, _, clock = make([FakeGpu("GPU-a", profile="ideal", points=points)])
    intervals = read_in_intervals(col, clock, 15)
    energy = [math.fsum(t.energy_j for t in iv if t.energy_j is not None) for iv in intervals]
    assert energy == pytest.approx([1_500.0] * 3)
    assert [iv[-1].energy_method for iv in intervals] == [ENERGY_POWER, ENERGY_POWER, ENERGY_COUNTER]


def test_without_an_energy_counter_power_is_integrated_at_every_tick() -> None:
    no_counter = frozenset({pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION})
    gpu = ideal("GPU-a", points=[TracePoint(0, power_w=250.0)], unsupported_fields=no_counter,
                unsupported=frozenset({"nvmlDeviceGetTotalEnergyConsumption"}))  # fmt: skip
    col, _, clock = make([gpu])
    intervals = read_in_intervals(col, clock, 10)
    assert [[t.energy_j for t in iv] for iv in intervals] == [[pytest.approx(250.0)] * 5] * 2
    assert {t.energy_method for iv in intervals for t in iv} == {ENERGY_POWER}


def test_a_counter_reading_that_fails_leaves_its_time_to_the_next_one() -> None:
    points = [TracePoint(0, util_pct=90, throttle=("power",))]
    col, fake, clock = make([ideal("GPU-a", points=points)])
    fields = fake.nvmlDeviceGetFieldValues
    failing = {"now": False}

    def flaky(h, ids):
        if failing["now"] and 74 in ids:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return fields(h, ids)

    def flaky_classic(h, policy):  # the deprecated call, tried for what the fields lack
        if failing["now"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return fake.nvmlDeviceGetViolationStatus(h, policy)

    col._throttle._f_fields, col._throttle._f_viol = flaky, flaky_classic
    col.read({77}, clock.t)
    clock.t += 5.0
    failing["now"] = True
    first = col.read({77}, clock.t, closes_interval=True).ticks[0]
    failing["now"] = False
    clock.t += 5.0
    second = col.read({77}, clock.t, closes_interval=True).ticks[0]
    assert first.throttle_s is None  # not known: not "nothing throttled"
    assert second.throttle_s["power"] == pytest.approx(10.0)  # nothing lost


def test_each_counter_reading_owns_its_throttle_figures() -> None:
    # Each tick's figures are its own: a consumer that adds into one tick's dict (a sum kept in
    # place) must not leak into later ticks.
    col, _, clock = make([ideal("GPU-a", points=[TracePoint(0, util_pct=90, throttle=())])])
    ticks, _ = run(col, clock, 2)
    assert ticks[0].throttle_s == ticks[1].throttle_s == dict.fromkeys(POLICIES, 0.0)
    ticks[0].throttle_s["power"] += 5.0
    later, _ = run(col, clock, 4)
    assert all(t.throttle_s["power"] == 0.0 for t in [ticks[1], *later])


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
    col, _, clock = make([ideal("GPU-a", points=[TracePoint(0, util_pct=100, mem_used_b=33 * GiB, procs=procs)])])
    t = run(col, clock, 2, pids={77, 78, 90})[0][-1]
    assert t.proc_mem_b == 3 * GiB and t.mem_used_b == 33 * GiB and t.proc_method == "pid"
    assert t.proc_sm_util_pct == pytest.approx(75.0)
    t = run(col, clock, 4, pids={5})[0][-1]
    assert t.proc_mem_b == 0 and t.proc_sm_util_pct == 0.0  # not on this GPU: a true zero


@pytest.mark.parametrize("kind", ["mps", "graphics"])
def test_a_process_in_a_rare_list_is_metered_at_every_read_once_seen(kind: str) -> None:
    # The MPS and graphics lists are empty on almost every training node, so while empty they are
    # asked every tenth read only; a run that turns out to live there (an MPS client, a renderer)
    # must then be metered at every read, not one in ten.
    points = [TracePoint(0, util_pct=50), TracePoint(3, util_pct=50, procs={77: (2 * GiB, 40.0), 4242: (GiB, 5.0)})]
    col, fake, clock = make([ideal("GPU-a", points=points, process_list=kind)])
    ticks, _ = run(col, clock, 40)
    mem = [t.proc_mem_b for t in ticks]
    first = mem.index(2 * GiB)
    assert first <= 10  # found by the first sweep after it appeared
    assert mem[first:] == [2 * GiB] * (len(mem) - first)
    assert all(t.proc_method == "pid" for t in ticks[first:])
    name = "nvmlDeviceGetMPSComputeRunningProcesses" if kind == "mps" else "nvmlDeviceGetGraphicsRunningProcesses"
    asked = sum(n for f, n in fake.calls.items() if f.startswith(name))
    assert asked <= first // 10 + 1 + len(ticks) - first  # not every read while the list was empty


def test_empty_rare_lists_are_not_asked_at_every_read() -> None:
    procs = {77: (GiB, 80.0), 4242: (3 * GiB, 15.0)}
    col, fake, clock = make([ideal("GPU-a", points=[TracePoint(0, util_pct=90, procs=procs)])])
    ticks, _ = run(col, clock, 39)
    for name in ("nvmlDeviceGetMPSComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        asked = sum(n for f, n in fake.calls.items() if f.startswith(name))
        assert 1 <= asked <= len(ticks) // 10 + 1
    assert all(t.proc_mem_b == GiB for t in ticks)  # the compute list, at every read


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
    # every call answers Unknown during the reload: that is the GPU gone, not a field failing
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
    assert {t.energy_method for t in ticks} == {ENERGY_COUNTER}


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


def test_the_node_view_reports_every_process_on_every_gpu() -> None:
    procs = {401: (2 * GiB, 60.0), 402: (GiB, 10.0)}
    gpus = [ideal("GPU-a", points=[TracePoint(0, util_pct=70, procs=procs)]), ideal("GPU-b", points=[TracePoint(0)])]
    clock = Clock()
    fake = FakeNvml(gpus, clock=clock, start=clock.t)
    col = NvmlCollector(nvml=fake, clock=clock, all_processes=True)
    col.read(set(), clock.t)
    clock.t += 1
    r = col.read(set(), clock.t)
    seen = {(p.uuid, p.pid): (p.mem_b, p.sm_pct) for p in r.processes}
    assert seen == {("GPU-a", 401): (2 * GiB, 60.0), ("GPU-a", 402): (GiB, 10.0)}
    assert len(r.ticks) == 2 and all(t.proc_mem_b is None for t in r.ticks)  # no run of its own
