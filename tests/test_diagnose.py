"""Each diagnosis rule on a trace that must trigger it and on one that must not."""

from __future__ import annotations

from pathlib import Path

import pytest

from diag_support import GIB, T0, device, epoch_events, gpu_intervals, host_intervals, make_trace
from gpuledger.core.diagnosis.diagnose import RunFacts, Thresholds, diagnose
from gpuledger.core.model import Event

ROOT = Path(__file__).resolve().parents[1]


def rules(trace) -> dict[str, object]:
    return {f.rule: f for f in diagnose(trace)}


def healthy(n: int = 720, **kw):
    """One GPU 90 % busy with 60 GiB of 80 in use, a CPU side with room to spare: nothing to report."""
    dev = device(0)
    gpu = {dev.uuid: gpu_intervals(dev.uuid, n, mem_gib=lambda i: 60.0, **kw)}
    return make_trace([dev], gpu, host_intervals(n, cores=lambda i: 3.0))


def test_a_healthy_run_has_no_findings() -> None:
    assert diagnose(healthy()) == []


# -- input pipeline -------------------------------------------------------------------------------


def test_input_pipeline_bound_when_gpu_starved_and_cpu_saturated() -> None:
    dev = device(0)
    gpu = {dev.uuid: gpu_intervals(dev.uuid, 200, util=lambda i: 0.2, mem_gib=lambda i: 60.0)}
    trace = make_trace([dev], gpu, host_intervals(200, cores=lambda i: 7.6), cores=8)
    f = rules(trace)["input_pipeline"]
    assert f.severity == "critical"
    assert f.figures["reason"] == "cpu" and f.figures["share"] == pytest.approx(1.0)
    assert "workers" in f.action
    assert f.evidence and f.evidence[0].charts == ("gpu_util", "cpu")


def test_input_pipeline_single_process_loader_is_caught_without_knowing_the_cores() -> None:
    dev = device(0)
    gpu = {dev.uuid: gpu_intervals(dev.uuid, 100, util=lambda i: 0.15, mem_gib=lambda i: 60.0)}
    trace = make_trace(
        [dev], gpu, host_intervals(100, cores=lambda i: 0.98, procs=1, sys_cpu=lambda i: None), cores=None
    )
    assert rules(trace)["input_pipeline"].figures["reason"] == "single_process"


def test_input_pipeline_iowait() -> None:
    dev = device(0)
    gpu = {dev.uuid: gpu_intervals(dev.uuid, 100, util=lambda i: 0.3, mem_gib=lambda i: 60.0)}
    trace = make_trace([dev], gpu, host_intervals(100, cores=lambda i: 1.0, iowait=lambda i: 2.0), cores=8)
    f = rules(trace)["input_pipeline"]
    assert f.figures["reason"] == "iowait" and "storage" in f.action.lower()


def test_no_input_pipeline_finding_when_the_cpu_has_room_or_the_gpu_is_busy() -> None:
    dev = device(0)
    starved_idle_cpu = make_trace(
        [dev],
        {dev.uuid: gpu_intervals(dev.uuid, 200, util=lambda i: 0.2)},
        host_intervals(200, cores=lambda i: 2.0),
        cores=8,
    )
    busy_gpu_busy_cpu = make_trace(
        [dev],
        {dev.uuid: gpu_intervals(dev.uuid, 200, util=lambda i: 0.9)},
        host_intervals(200, cores=lambda i: 7.9),
        cores=8,
    )
    brief = make_trace(
        [dev],
        {dev.uuid: gpu_intervals(dev.uuid, 200, util=lambda i: 0.2 if i < 10 else 0.9)},
        host_intervals(200, cores=lambda i: 7.9),
        cores=8,
    )
    for trace in (starved_idle_cpu, busy_gpu_busy_cpu, brief):
        assert "input_pipeline" not in rules(trace)


# -- memory leak ----------------------------------------------------------------------------------


def test_memory_leak_rising_across_epochs_with_estimated_oom_epoch() -> None:
    dev = device(0, memory_gib=80)
    per_epoch = 60  # intervals of 5 s
    # 20 GiB, then +4 GiB every epoch: epoch 10 peaks at 56 GiB, 24 GiB left -> 6 more epochs -> epoch 16
    mem = lambda i: 20.0 + 4.0 * (i // per_epoch)  # noqa: E731
    gpu = {dev.uuid: gpu_intervals(dev.uuid, 10 * per_epoch, mem_gib=mem, util=lambda i: 0.9)}
    trace = make_trace(
        [dev], gpu, host_intervals(600, cores=lambda i: 3.0), epoch_events(10, per_epoch * 5), meta={"epochs": 30}
    )
    f = rules(trace)["memory_leak"]
    assert f.figures["oom_epoch"] == 16
    assert f.figures["per_step_b"] == pytest.approx(4 * GIB)
    assert f.severity == "critical"  # it runs out before the planned 30 epochs
    assert "epoch 16 of 30" in f.title


def test_no_memory_leak_for_a_plateau_after_warm_up() -> None:
    dev = device(0)
    mem = lambda i: 10.0 if i < 60 else 50.0 + (0.01 if i % 2 else 0.0)  # noqa: E731
    gpu = {dev.uuid: gpu_intervals(dev.uuid, 600, mem_gib=mem)}
    trace = make_trace([dev], gpu, host_intervals(600, cores=lambda i: 3.0), epoch_events(10, 300))
    assert "memory_leak" not in rules(trace)


def test_memory_leak_without_epochs_uses_time_windows() -> None:
    dev = device(0)
    gpu = {dev.uuid: gpu_intervals(dev.uuid, 720, mem_gib=lambda i: 20 + i * 0.05)}
    f = rules(make_trace([dev], gpu, host_intervals(720, cores=lambda i: 3.0)))["memory_leak"]
    assert f.figures["by"] == "time" and f.figures["oom_epoch"] is None


# -- OOM crash ------------------------------------------------------------------------------------


def test_oom_crash_from_an_event_with_peak_vram_before_it() -> None:
    dev = device(0)
    gpu = {dev.uuid: gpu_intervals(dev.uuid, 100, mem_gib=lambda i: 40 + i * 0.39)}
    crash_t = T0 + 450
    ev = Event(crash_t, "cuda_oom", "CUDA out of memory at epoch 3", {"epoch": 3, "fatal": True})
    f = rules(make_trace([dev], gpu, events=[ev], status="failed", reason="CUDA out of memory at epoch 3"))["oom_crash"]
    assert f.severity == "critical" and "epoch 3" in f.title
    peak = f.figures["peak_memory_b"]
    assert peak == int((40 + 89 * 0.39) * GIB)  # the last interval that started before the crash
    assert f.evidence[0].t1 == crash_t and f.evidence[0].charts == ("vram",)


def test_oom_crash_from_the_status_reason_alone() -> None:
    dev = device(0)
    gpu = {dev.uuid: gpu_intervals(dev.uuid, 20, mem_gib=lambda i: 79.0)}
    f = rules(make_trace([dev], gpu, status="failed", reason="torch.OutOfMemoryError: CUDA out of memory"))
    assert f["oom_crash"].figures["peak_share"] == pytest.approx(79 / 80)


def test_host_oom_kill_and_recovered_oom() -> None:
    dev = device(0)
    gpu = {dev.uuid: gpu_intervals(dev.uuid, 20, mem_gib=lambda i: 60.0)}
    killed = Event(T0 + 90, "oom_killed", "a data-loader worker was killed", {"fatal": True})
    recovered = Event(T0 + 10, "cuda_oom", "retried", {"fatal": False, "batch": 32, "retry_batch": 16})
    found = diagnose(make_trace([dev], gpu, host_intervals(20), events=[recovered, killed], status="killed"))
    kinds = [(f.rule, f.severity) for f in found]
    assert ("oom_crash", "critical") in kinds and ("oom_crash", "info") in kinds
    assert any("host memory" in f.title for f in found)


def test_no_oom_finding_for_other_failures() -> None:
    dev = device(0)
    gpu = {dev.uuid: gpu_intervals(dev.uuid, 20, mem_gib=lambda i: 60.0)}
    trace = make_trace(
        [dev], gpu, status="failed", reason="exited with code 1", events=[Event(T0 + 5, "nan_loss", "loss is nan")]
    )
    assert "oom_crash" not in rules(trace)


# -- idle allocated GPUs --------------------------------------------------------------------------


def test_idle_gpus_never_used_and_long_idle_span() -> None:
    used, unused = device(0), device(1)
    n = 1440  # 2 h of 5 s intervals
    idle = lambda i: 0.01 if 300 <= i < 500 else 0.9  # noqa: E731  # 1000 s idle
    gpu = {
        used.uuid: gpu_intervals(used.uuid, n, util=idle, mem_gib=lambda i: 60.0),
        unused.uuid: gpu_intervals(unused.uuid, n, util=lambda i: 0.0, mem_gib=lambda i: 0.5),
    }
    f = rules(make_trace([used, unused], gpu, host_intervals(n, cores=lambda i: 3.0)))["idle_gpus"]
    assert f.figures["unused"] == [1]
    assert f.figures["idle_spans"] == 1
    assert f.figures["idle_gpu_h"] == pytest.approx(1000 / 3600)
    assert {e.gpu for e in f.evidence} == {0, 1}


def test_no_idle_finding_for_short_dips() -> None:
    trace = healthy(util=lambda i: 0.0 if i % 50 == 0 else 0.9)
    assert "idle_gpus" not in rules(trace)


# -- throttling -----------------------------------------------------------------------------------


def test_throttling_share_with_thermal_advice() -> None:
    dev = device(0)
    hot = lambda i: {"thermal": 5.0, "low_util": 5.0} if i % 4 == 0 else {}  # noqa: E731
    gpu = {dev.uuid: gpu_intervals(dev.uuid, 400, throttle=hot, mem_gib=lambda i: 60.0, temp=lambda i: 91.0)}
    f = rules(make_trace([dev], gpu, host_intervals(400, cores=lambda i: 3.0)))["throttling"]
    assert f.figures["share"] == pytest.approx(0.25)
    assert f.figures["main"] == "thermal" and "airflow" in f.action
    assert "low_util" not in f.figures["by_reason"]  # an idle GPU clocking down is not a problem


def test_no_throttling_finding_below_threshold_or_when_not_measured() -> None:
    rare = healthy(throttle=lambda i: {"power": 5.0} if i % 20 == 0 else {})
    unknown = healthy(throttle=lambda i: None)
    for trace in (rare, unknown):
        assert "throttling" not in rules(trace)


# -- under-used -----------------------------------------------------------------------------------


def test_underused_gpu_and_its_deference_to_the_input_pipeline() -> None:
    dev = device(0)
    gpu = {dev.uuid: gpu_intervals(dev.uuid, 300, util=lambda i: 0.4, mem_gib=lambda i: 8.0, proc_gib=lambda i: 6.0)}
    plain = rules(make_trace([dev], gpu, host_intervals(300, cores=lambda i: 2.0)))["underused"]
    assert plain.figures["gpus"][0]["peak_b"] == 6 * GIB  # the run's own processes, not the device
    assert plain.action.startswith("A larger batch")
    starved = rules(make_trace([dev], gpu, host_intervals(300, cores=lambda i: 7.9)))["underused"]
    assert starved.action.startswith("Fix the input pipeline first")


def test_no_underused_finding_for_a_full_gpu() -> None:
    assert "underused" not in rules(healthy(util=lambda i: 0.4))  # 60 of 80 GiB used


# -- regression -----------------------------------------------------------------------------------


def _facts(i: int, sec: float, best: float = 0.5, busy: float = 10.0, cost: float | None = None) -> RunFacts:
    return RunFacts(f"run-{i}", T0 - 86400 * (10 - i), 10, sec, best, busy, cost, "USD" if cost else None)


def test_regression_slower_per_epoch_and_costlier_per_map_point() -> None:
    history = [_facts(i, 300.0 + i, cost=20.0) for i in range(6)]
    me = RunFacts("me", T0, 10, 400.0, 0.4, 13.0, 30.0, "USD")
    f = rules(_with(me, history))["regression"]
    assert f.figures["baseline_sec_per_epoch"] == pytest.approx(303.0)  # median of the 5 latest
    assert len(f.figures["baseline_runs"]) == 5
    assert f.figures["basis"] == "cost"
    assert "slower per epoch" in f.detail and "costlier per mAP point" in f.detail


def _with(me: RunFacts, history: list[RunFacts]):
    trace = healthy()
    trace.facts, trace.history = me, history
    return trace


def test_no_regression_within_tolerance_or_without_history() -> None:
    history = [_facts(i, 300.0) for i in range(3)]
    assert "regression" not in rules(_with(RunFacts("me", T0, 10, 330.0, 0.5, 10.0), history))
    assert "regression" not in rules(_with(RunFacts("me", T0, 10, 900.0, 0.5, 10.0), []))


# -- thresholds are documented --------------------------------------------------------------------


def test_every_threshold_is_documented_in_reports_md() -> None:
    doc = (ROOT / "docs" / "REPORTS.md").read_text()
    for name, value in Thresholds().__dict__.items():
        assert f"`{name}`" in doc, name
        assert str(value) in doc or f"{value * 100:g} %" in doc, (name, value)
