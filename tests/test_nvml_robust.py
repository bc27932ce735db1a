"""The NVML collector against how real hardware misbehaves: the scripted NVML reproduces each case."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pynvml
import pytest

from gpuledger.collect.fake_nvml import Failing, FakeGpu, FakeNvml, TracePoint
from gpuledger.collect.nvml import NvmlCollector
from gpuledger.collect.pid_owner import PidOwner
from nvml_support import T0, Clock, GiB, busy_truth, make, run

H100 = "NVIDIA H100 80GB HBM3"
P = 1 / 6


def busy(ticks) -> float:
    return sum(t.busy_s or 0.0 for t in ticks)


def notes(events) -> list[str]:
    return [e.message for e in events if e.kind == "note"]


# -- the sample buffer --------------------------------------------------------------------------


def stepped_wall(clock: Clock, steps: list[tuple[float, float]]):
    """A wall clock that follows ``clock`` and jumps by each (at trace second, by seconds)."""

    def wall() -> float:
        return clock.t + sum(by for at, by in steps if clock.t - T0 >= at)

    return wall


@pytest.mark.parametrize("step_s", [3600.0, -30.0])
def test_a_wall_clock_step_adds_no_phantom_busy_time(step_s: float) -> None:
    points = [TracePoint(0, util_pct=40), TracePoint(30, util_pct=100), TracePoint(60, util_pct=0)]
    clock = Clock()
    wall = stepped_wall(clock, [(20.5, step_s)])
    fake = FakeNvml([FakeGpu("GPU-a", name=H100, points=points)], clock=clock, start=T0, wall_clock=wall)
    col = NvmlCollector(nvml=fake, clock=clock, wall=wall)  # clock: monotonic; wall: what NVML stamps with
    ticks, events = [], []
    while clock.t - T0 < 90:
        r = col.read(set(), clock.t)  # the recorder's time never steps (docs/METERING.md)
        ticks += r.ticks
        events += r.events
        clock.t += 1.0
    truth = busy_truth(points, 0, clock.t - 1 - T0)
    assert abs(busy(ticks) - truth) <= 0.01 * truth + 1.0  # the step is measured, not charged
    assert all(t.busy_s <= 1.0 + P + 1e-9 for t in ticks)  # no tick holds the step
    assert any("stepped" in m for m in notes(events))
    if step_s < 0:  # samples are behind the cursor until the clock catches up: the instant reading
        assert any(t.util_method == "instant,samples" and t.util_unknown_s for t in ticks)


def test_a_first_read_that_fails_does_not_integrate_the_buffer_from_before_the_run() -> None:
    # the GPU was busy (someone else's job) before the run; the first buffer read fails
    points = [TracePoint(0, util_pct=100)]
    gpu = FakeGpu("GPU-a", name=H100, points=points, failing=[Failing("nvmlDeviceGetSamples", None, 0.5)])
    col, _, clock = make([gpu])
    ticks, _ = run(col, clock, 5)
    assert busy(ticks) <= 5 + P  # not the ~16 s the buffer held at the start
    assert busy(ticks) >= 5 - 2 * P
    assert ticks[0].util_unknown_s == pytest.approx(1.0) and ticks[0].util_method == "instant,samples"


@pytest.mark.parametrize("instant", [True, False])
def test_a_buffer_read_that_fails_once_leaves_no_tick_holding_more_than_its_time(instant: bool) -> None:
    # a busy GPU; GetSamples answers Unknown at one read in the middle (a passing error)
    points = [TracePoint(0, util_pct=100)]
    unsupported = frozenset() if instant else frozenset({"nvmlDeviceGetUtilizationRates"})
    gpu = FakeGpu("GPU-a", name=H100, points=points, failing=[Failing("nvmlDeviceGetSamples", 9.5, 10.5)],
                  unsupported=unsupported)  # fmt: skip
    col, _, clock = make([gpu])
    ticks, _ = run(col, clock, 20)
    failed = next(t for t in ticks if t.t1 - T0 == 10)
    after = next(t for t in ticks if t.t1 - T0 == 11)
    assert after.busy_s <= 1.0 + P + 1e-9  # not the ~2 s of both reads
    assert all(t.busy_s is not None and t.busy_s <= 1.0 + P + 1e-9 for t in ticks)
    assert failed.util_unknown_s == pytest.approx(1.0, abs=P)
    if instant:  # the span the buffer could not be read for is measured by the instant reading
        assert failed.util_method == "instant,samples"
        assert busy(ticks) == pytest.approx(20.0, abs=2 * P)
    else:  # or recorded as unmeasured, never guessed as busy
        assert failed.util_method == "samples" and failed.busy_s == 0.0
        assert busy(ticks) == pytest.approx(19.0, abs=2 * P)


def test_a_stalled_reader_that_finds_the_buffer_wrapped_measures_the_lost_span_by_the_instant_reading() -> None:
    points = [TracePoint(0, util_pct=100), TracePoint(200, util_pct=0)]
    col, _, clock = make([FakeGpu("GPU-a", name=H100, points=points)])
    ticks, _ = run(col, clock, 5)
    clock.t += 40  # the recorder thread stalled (a slow ledger write): the buffer holds ~16 s
    more, events = run(col, clock, 60)
    stalled = more[0]
    assert stalled.util_unknown_s == pytest.approx(40 - 100 * P, abs=0.5)
    assert stalled.util_method == "instant,samples"
    assert busy(ticks + more) == pytest.approx(60.0, abs=1.0)
    assert any("wrapped" in m for m in notes(events))
    # without an instant reading the lost span is recorded as unmeasured, never guessed as busy
    no_instant = FakeGpu("GPU-a", name=H100, points=points, unsupported=frozenset({"nvmlDeviceGetUtilizationRates"}))
    col, _, clock = make([no_instant])
    ticks, _ = run(col, clock, 5)
    clock.t += 40
    more, _ = run(col, clock, 60)
    assert more[0].util_method == "samples" and more[0].util_unknown_s > 20
    assert busy(ticks + more) == pytest.approx(60.0 - more[0].util_unknown_s, abs=1.0)


def test_a_reader_that_is_merely_slow_loses_nothing() -> None:
    # a 3 s gap between reads on an idle-stopping GPU: nothing was lost, the gap is idle
    points = [TracePoint(0, util_pct=0), TracePoint(10, util_pct=100), TracePoint(11, util_pct=0)]
    col, _, clock = make([FakeGpu("GPU-a", name=H100, points=points)])
    ticks, _ = run(col, clock, 30, step=3.0)
    assert busy(ticks) == pytest.approx(1.0, abs=P)
    assert all(t.util_unknown_s == 0 for t in ticks)


# -- fields that fail alone, and a GPU that is gone ---------------------------------------------


def test_unknown_from_one_field_drops_that_field_and_keeps_metering_the_gpu() -> None:
    points = [TracePoint(0, util_pct=50, power_w=200.0, mem_used_b=GiB, sm_clock_mhz=1400)]
    gpu = FakeGpu("GPU-a", points=points, failing=[Failing("nvmlDeviceGetClockInfo")])
    col, fake, clock = make([gpu])
    ticks, events = run(col, clock, 20)
    assert len(ticks) == 20 and all(t.busy_s and t.energy_j and t.mem_used_b == GiB for t in ticks)
    assert all(t.sm_clock_mhz is None for t in ticks)
    assert [e.kind for e in events if e.kind.startswith("gpu_")] == []  # not lost
    assert any(e.payload.get("dropped") for e in events)
    assert fake.calls["nvmlDeviceGetClockInfo"] == 6  # sm and mem clock: three tries each, then never again


def test_a_failing_energy_field_falls_back_to_the_classic_counter() -> None:
    points = [TracePoint(0, power_w=300.0)]
    gpu = FakeGpu("GPU-a", profile="ideal", points=points,
                  failing=[Failing(pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION)])  # fmt: skip
    col, _, clock = make([gpu])
    ticks, _ = run(col, clock, 10)
    assert sum(t.energy_j for t in ticks[1:]) == pytest.approx(9 * 300.0, abs=0.01)
    assert ticks[-1].energy_method == "counter"


def test_an_energy_counter_that_stops_counting_is_not_billed_as_zero_energy() -> None:
    # The counter holds its value for 10 s while the GPU draws 300 W (counters seen frozen in the
    # field): those ticks integrate power, one event says why, and the run's energy stays right.
    points = [TracePoint(0, power_w=300.0, util_pct=100)]
    gpu = FakeGpu("GPU-a", name=H100, points=points, energy_stuck=[(10.0, 20.0)])
    col, _, clock = make([gpu])
    ticks, events = run(col, clock, 30)
    # Not 20 * 300 J: only the tick in which the counter stopped keeps the little it counted (a
    # counter that moved is a reading, not a broken one), and the counter's 0.1 s steps
    assert 28 * 300.0 <= sum(t.energy_j for t in ticks) <= 30 * 300.0 * 1.01
    stuck = [t for t in ticks if 12 <= t.t1 - T0 <= 20]  # from the first whole tick it held
    assert stuck and all(t.energy_method == "power" for t in stuck)
    assert ticks[-1].energy_method == "counter"  # counting again: the counter again
    said = [e.message for e in events if e.kind == "sampler_error"]
    assert len(said) == 1 and "did not move in 1.0 s while the GPU drew 300 W" in said[0]


def test_an_energy_counter_that_jumps_beyond_what_the_gpu_can_draw_is_not_billed() -> None:
    # One reading 10 MJ too high (scripted counter values; a drop afterwards is a reset): the
    # spans around it integrate power, and no tick holds more than the GPU drew.
    points = [TracePoint(0, power_w=300.0, energy_j=0.0), TracePoint(9.95, energy_j=2_985.0),
              TracePoint(10.05, energy_j=10_003_015.0), TracePoint(10.15, energy_j=3_045.0)]  # fmt: skip
    gpu = FakeGpu("GPU-a", profile="ideal", points=points)
    col, _, clock = make([gpu])
    ticks, events = run(col, clock, 20, step=0.1)
    assert sum(t.energy_j for t in ticks) == pytest.approx(20 * 300.0, rel=0.01)
    assert max(t.energy_j for t in ticks) <= 300.0 * 0.1 * 1.01
    said = [e.message for e in events if e.kind == "sampler_error"]
    assert any(re.search(r"rose 10,000,\d{3} J in 0.1 s, more than the GPU can draw", m) for m in said), said


def test_memory_v2_failing_is_dropped_for_v1_after_three_tries() -> None:
    clock = Clock()
    fake = FakeNvml([FakeGpu("GPU-a", points=[TracePoint(0, mem_used_b=4 * GiB)], memory_reserved_b=GiB)],
                    clock=clock, start=T0)  # fmt: skip
    v1 = fake.nvmlDeviceGetMemoryInfo
    calls = []

    def v2_broken(handle, version=None):
        calls.append(version)
        if version:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return v1(handle)

    fake.nvmlDeviceGetMemoryInfo = v2_broken  # type: ignore[method-assign]
    col = NvmlCollector(nvml=fake, clock=clock)
    assert col.devices()[0].memory_total_b == 80 * GiB  # discovery too falls back to v1
    calls.clear()
    ticks, events = run(col, clock, 8)
    assert all(t.mem_used_b == 5 * GiB for t in ticks)  # v1: used includes reserved, every tick
    assert sum(1 for v in calls if v) == 3  # v2 tried three times, not every tick
    assert sum(1 for e in events if e.payload.get("series") == "mem_v2") == 2  # the error, then "dropped"


# -- the run's processes ------------------------------------------------------------------------


def container_proc(root: Path, run_pid: int, minor: int) -> Path:
    """A /proc as a container sees it: no kthreadd; the run's process holds /dev/nvidia<minor>."""
    for pid, comm, ppid in ((1, "sh", 0), (run_pid, "python", 1)):
        d = root / str(pid)
        (d / "fd").mkdir(parents=True)
        (d / "stat").write_text(f"{pid} ({comm}) S {ppid} 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 100\n")
        (d / "cgroup").write_text("0::/\n")
    os.symlink("/dev/nvidiactl", root / str(run_pid) / "fd" / "3")
    os.symlink(f"/dev/nvidia{minor}", root / str(run_pid) / "fd" / "4")
    return root


def test_in_a_container_host_pids_are_attributed_by_the_device_node(tmp_path: Path) -> None:
    points = [TracePoint(0, util_pct=90, mem_used_b=21 * GiB, procs={"run": (20 * GiB, 88.0)})]
    clock = Clock()
    fake = FakeNvml([FakeGpu("GPU-a", name=H100, points=points)], clock=clock, start=T0, host_pid_offset=400_000)
    fake.run_pids = [77]
    col = NvmlCollector(nvml=fake, clock=clock, owner=PidOwner(str(container_proc(tmp_path / "p", 77, 0))))
    ticks, events = run(col, clock, 5, pids={77})
    assert {t.proc_mem_b for t in ticks} == {20 * GiB} and {t.proc_method for t in ticks} == {"pidns"}
    assert all(t.proc_sm_util_pct == pytest.approx(88.0) for t in ticks[1:])
    assert any("PID namespace" in m for m in notes(events))


def test_in_a_container_another_tenant_on_the_gpu_makes_the_share_unknown(tmp_path: Path) -> None:
    points = [TracePoint(0, util_pct=90, mem_used_b=30 * GiB, procs={"run": (20 * GiB, 60.0), 4242: (9 * GiB, 30.0)})]
    clock = Clock()
    fake = FakeNvml([FakeGpu("GPU-a", name=H100, points=points)], clock=clock, start=T0, host_pid_offset=400_000)
    fake.run_pids = [77]
    col = NvmlCollector(nvml=fake, clock=clock, owner=PidOwner(str(container_proc(tmp_path / "p", 77, 0))))
    ticks, events = run(col, clock, 3, pids={77})
    assert {t.proc_mem_b for t in ticks} == {None} and {t.proc_sm_util_pct for t in ticks} == {None}
    assert any("cannot be told" in m for m in notes(events))
    assert all(t.mem_used_b == 30 * GiB and t.busy_s for t in ticks)  # the GPU itself is still metered


def test_the_runs_share_follows_its_processes_facts_as_soon_as_they_are_read_again(tmp_path: Path) -> None:
    # The collector reuses its verdict on a GPU's processes while nothing it rests on is due to be
    # read again: a process that closes the GPU's device node must still be seen when /proc is.
    points = [TracePoint(0, util_pct=90, mem_used_b=21 * GiB, procs={"run": (20 * GiB, 88.0)})]
    clock = Clock()
    fake = FakeNvml([FakeGpu("GPU-a", name=H100, points=points)], clock=clock, start=T0, host_pid_offset=400_000)
    fake.run_pids = [77]
    proc = container_proc(tmp_path / "p", 77, 0)
    col = NvmlCollector(nvml=fake, clock=clock, owner=PidOwner(str(proc), clock=clock))
    ticks, _ = run(col, clock, 5, pids={77})
    assert {t.proc_method for t in ticks} == {"pidns"}
    (proc / "77" / "fd" / "4").unlink()  # the run's process let go of /dev/nvidia0 (read at T0 + 1 s)
    ticks, _ = run(col, clock, 29, pids={77})
    assert {t.proc_method for t in ticks} == {"pidns"}  # the fact is not due yet: as without reuse
    ticks, _ = run(col, clock, 32, pids={77})
    assert [t.proc_method for t in ticks] == ["pidns", None, None]  # T0 + 30, 31, 32: read again at 31
    assert ticks[-1].proc_mem_b is None


def test_a_new_process_of_the_run_is_attributed_at_once(tmp_path: Path) -> None:
    points = [TracePoint(0, util_pct=90, procs={"run": (20 * GiB, 70.0), 4242: (9 * GiB, 30.0)})]
    col, fake, clock = make([FakeGpu("GPU-a", name=H100, points=points)])
    fake.run_pids = [77]
    ticks, _ = run(col, clock, 3, pids={77})
    assert {t.proc_mem_b for t in ticks} == {20 * GiB}
    ticks, _ = run(col, clock, 5, pids={77, 4242})  # pid 4242 joined the run's tree
    assert [t.proc_mem_b for t in ticks] == [29 * GiB] * 2


def test_a_host_pid_equal_to_one_of_ours_is_not_taken_for_ours(tmp_path: Path) -> None:
    # in a container, pid 77 is ours; the host pid 77 on the GPU is someone else's (it holds no GPU here)
    points = [TracePoint(0, util_pct=90, procs={77: (9 * GiB, 30.0), "run": (2 * GiB, 50.0)})]
    clock = Clock()
    fake = FakeNvml([FakeGpu("GPU-a", name=H100, points=points)], clock=clock, start=T0, host_pid_offset=500)
    proc = container_proc(tmp_path / "p", 99, 0)  # our GPU process is pid 99 here, host pid 599
    col = NvmlCollector(nvml=fake, clock=clock, owner=PidOwner(str(proc)))
    fake.run_pids = [99]
    ticks, _ = run(col, clock, 3, pids={77, 99})
    assert {t.proc_mem_b for t in ticks} == {None}  # two processes, one ours: cannot tell which


def test_drivers_that_translate_the_process_list_but_not_the_samples(tmp_path: Path) -> None:
    points = [TracePoint(0, util_pct=90, procs={"run": (20 * GiB, 70.0)})]
    clock = Clock()
    fake = FakeNvml([FakeGpu("GPU-a", name=H100, points=points)], clock=clock, start=T0,
                    host_pid_offset=400_000, pid_translation="lists")  # fmt: skip
    fake.run_pids = [77]
    col = NvmlCollector(nvml=fake, clock=clock, owner=PidOwner(str(container_proc(tmp_path / "p", 77, 0))))
    ticks, _ = run(col, clock, 4, pids={77})
    assert {t.proc_method for t in ticks} == {"pid"} and {t.proc_mem_b for t in ticks} == {20 * GiB}
    assert all(t.proc_sm_util_pct == pytest.approx(70.0) for t in ticks[1:])  # the only process is ours


def test_stale_and_impossible_process_samples_are_dropped() -> None:
    points = [TracePoint(0, util_pct=90, procs={"run": (GiB, 40.0)})]
    gpu = FakeGpu("GPU-a", points=points, putil_quirks=frozenset({"stale", "over_100"}))
    col, fake, clock = make([gpu])
    fake.run_pids = [77]
    ticks, _ = run(col, clock, 6)
    assert all(t.proc_sm_util_pct is not None and t.proc_sm_util_pct <= 100 for t in ticks)
    assert ticks[-1].proc_sm_util_pct == pytest.approx(40.0)


# -- MIG ----------------------------------------------------------------------------------------


def mig_gpu() -> FakeGpu:
    slices = [
        FakeGpu("MIG-s0", mig_profile="3g.40gb", memory_total_b=40 * GiB, gpu_instance_id=1,
                points=[TracePoint(0, mem_used_b=9 * GiB, procs={77: (8 * GiB, None)})]),
        FakeGpu("MIG-s1", mig_profile="3g.40gb", memory_total_b=40 * GiB, gpu_instance_id=2),
    ]  # fmt: skip
    return FakeGpu("GPU-p", points=[TracePoint(0, power_w=250.0)], mig=slices)


def test_a_mig_slice_has_no_busy_or_energy_and_says_so() -> None:
    col, _, clock = make([mig_gpu()], visible="MIG-s0")
    (d,) = col.devices()
    assert (d.uuid, d.mig_parent_uuid, d.mig_profile, d.mig_mode) == ("MIG-s0", "GPU-p", "3g.40gb", "enabled")
    ticks, events = run(col, clock, 3)
    assert all(t.mem_used_b == 9 * GiB for t in ticks)
    assert all(t.busy_s is None and t.energy_j is None and t.util_method is None for t in ticks)
    assert all(t.proc_mem_b is None for t in ticks)  # NVML reports no per-process memory on MIG: not 0
    assert any("no utilisation for a MIG slice" in m and "busy_unmeasured" in m for m in notes(events))


def test_a_mig_parent_named_by_index_or_uuid_is_metered_as_its_first_slice() -> None:
    for visible in ("0", "GPU-p"):
        col, _, clock = make([mig_gpu()], visible=visible)
        assert [d.uuid for d in col.devices()] == ["MIG-s0"]
        _, events = run(col, clock, 2)
        assert any("in MIG mode: CUDA runs on its first MIG device" in m for m in notes(events))


def test_the_r450_mig_name_selects_the_slice_by_instance_ids() -> None:
    col, _, _ = make([mig_gpu()], visible="MIG-GPU-p/2/0")
    assert [d.uuid for d in col.devices()] == ["MIG-s1"]


def test_a_function_the_installed_nvidia_ml_py_lacks_is_absent_without_an_error() -> None:
    """An older nvidia-ml-py has no nvmlDeviceGetTemperatureV: the deprecated call answers instead,
    every tick, and no sampler error is recorded for the missing function."""
    clock = Clock()
    gpu = FakeGpu("GPU-a", name=H100, points=[TracePoint(0, util_pct=50, temp_c=61)])
    fake = FakeNvml([gpu], clock=clock, start=T0)
    fake.nvmlDeviceGetTemperatureV = None  # what getattr finds on a module without the function
    col = NvmlCollector(nvml=fake, clock=clock)
    ticks, events = run(col, clock, until=5)
    assert len(ticks) == 5 and all(t.temp_c == 61 for t in ticks)
    assert [e for e in events if e.kind == "sampler_error"] == []
    assert fake.calls["nvmlDeviceGetTemperature"] >= 5
