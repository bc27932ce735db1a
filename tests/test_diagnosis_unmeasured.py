"""What the diagnosis and the run summary do with what was not measured: an unknown core count
(a report made on another host) and GPU time the driver's samples could not cover with no instant
reading (util_unknown_s, docs/METERING.md). Neither may be read as a fact."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from diag_support import T0, device, gpu_intervals, host_intervals, make_trace
from gpuledger.cli.main import cli
from gpuledger.core.diagnosis.diagnose import diagnose
from gpuledger.core.metering.summary import format_summary, summarize
from gpuledger.store import Ledger

STEP = 5.0


def _rules(trace) -> dict[str, object]:
    return {f.rule: f for f in diagnose(trace)}


# -- iowait when the core count is unknown -------------------------------------------------------


def _light_iowait(cores: int | None, sys_cpu: float = 20.0, iowait: float = 0.3):
    """40 % busy GPU, a six-process tree on one core, 0.3 core-seconds of iowait per second."""
    dev = device(0)
    gpu = {dev.uuid: gpu_intervals(dev.uuid, 480, util=lambda i: 0.4, mem_gib=lambda i: 60.0)}
    host = host_intervals(480, cores=lambda i: 1.0, iowait=lambda i: iowait, sys_cpu=lambda i: sys_cpu)
    return make_trace([dev], gpu, host, cores=cores)


def test_light_iowait_is_no_input_pipeline_finding_when_the_cores_are_unknown() -> None:
    # 0.3 core-s/s is 30 % of one core but under 1 % of 64: with the count unknown, no verdict.
    assert "input_pipeline" not in _rules(_light_iowait(cores=None))
    assert "input_pipeline" not in _rules(_light_iowait(cores=64))


def test_unknown_cores_still_fall_back_to_host_cpu_utilisation() -> None:
    f = _rules(_light_iowait(cores=None, sys_cpu=97.0))["input_pipeline"]
    assert f.figures["reason"] == "cpu" and f.figures["cores"] is None


def test_iowait_is_still_caught_when_the_cores_are_known() -> None:
    f = _rules(_light_iowait(cores=4, iowait=1.2))["input_pipeline"]  # 30 % of four cores' time
    assert f.figures["reason"] == "iowait"


# -- unmeasured GPU time is not idle --------------------------------------------------------------

N, MEASURED = 720, 540  # one hour: 45 min 90 % busy, then 15 min the samples could not cover


def _unmeasured_stretch(method: str = "samples"):
    """GPU intervals whose last 15 minutes are unknown (util_unknown_s = span, busy_s 0); with
    ``method`` "instant,samples" the instant reading measured that time (as 0 % busy)."""
    dev = device(0)
    ivs = gpu_intervals(dev.uuid, N, util=lambda i: 0.9 if i < MEASURED else 0.0, mem_gib=lambda i: 60.0)
    ivs = [
        iv if i < MEASURED else replace(iv, util_unknown_s=STEP, util_method=method, util_max_pct=None)
        for i, iv in enumerate(ivs)
    ]
    return dev, ivs


def test_unmeasured_gpu_time_is_no_idle_finding() -> None:
    dev, ivs = _unmeasured_stretch()
    trace = make_trace([dev], {dev.uuid: ivs}, host_intervals(N, cores=lambda i: 2.0), cores=16)
    assert "idle_gpus" not in _rules(trace)


def test_time_the_instant_reading_measured_idle_is_idle() -> None:
    dev, ivs = _unmeasured_stretch(method="instant,samples")
    trace = make_trace([dev], {dev.uuid: ivs}, host_intervals(N, cores=lambda i: 2.0), cores=16)
    f = _rules(trace)["idle_gpus"]
    assert f.figures["idle_gpu_h"] == pytest.approx(0.25)


def test_an_idle_finding_counts_measured_idle_time_and_says_what_was_not_measured() -> None:
    dev, ivs = _unmeasured_stretch()
    ivs = [replace(iv, busy_s=0.05, util_max_pct=1.0) if 180 <= i < 360 else iv for i, iv in enumerate(ivs)]
    trace = make_trace([dev], {dev.uuid: ivs}, host_intervals(N, cores=lambda i: 2.0), cores=16)
    f = _rules(trace)["idle_gpus"]
    assert f.figures["idle_spans"] == 1 and f.figures["idle_gpu_h"] == pytest.approx(0.25)
    assert f.figures["unmeasured_gpu_h"] == pytest.approx(0.25)
    assert "15 min of GPU time the driver's samples could not cover is not measured" in f.detail


def test_a_gpu_never_measured_is_not_called_never_used() -> None:
    dev = device(0)
    ivs = [replace(iv, busy_s=0.0, util_unknown_s=STEP) for iv in gpu_intervals(dev.uuid, N)]
    trace = make_trace([dev], {dev.uuid: ivs}, host_intervals(N, cores=lambda i: 2.0), cores=16)
    assert "idle_gpus" not in _rules(trace)


def _finished_run(rid: str, **kw):  # type: ignore[no-untyped-def]
    """The run the unmeasured stretch belongs to: N steps from T0, succeeded."""
    from gpuledger.core.model import RunRecord

    return RunRecord(id=rid, command=["python", "train.py"], user="u", cwd="/", started_at=T0,
                     status="succeeded", ended_at=T0 + N * STEP, **{"host": "h", **kw})  # fmt: skip


def _summary(ivs, dev):
    run = _finished_run("0190aaaa-0000-7000-8000-0000000000f1")
    return summarize(run, [dev], ivs, [], now=T0 + N * STEP)


def test_summary_idle_gpu_hours_leave_unmeasured_time_out() -> None:
    dev, ivs = _unmeasured_stretch()
    s = _summary(ivs, dev)
    assert s["allocated_gpu_hours"] == pytest.approx(1.0)
    assert s["busy_gpu_hours"] == pytest.approx(0.675)
    assert s["unmeasured_gpu_hours"] == pytest.approx(0.25)
    assert s["idle_gpu_hours"] == pytest.approx(0.075)  # 10 % of the 45 measured minutes, not 0.325
    assert s["mean_utilization"] == pytest.approx(0.9)  # of the measured time
    g = s["gpus"][0]
    assert (g["idle_seconds"], g["unmeasured_seconds"]) == (pytest.approx(270.0), pytest.approx(900.0))
    text = format_summary(s)
    assert "idle 0.0750" in text and "unmeasured 0.250" in text and "mean 90%" in text


def test_summary_counts_time_the_instant_reading_measured() -> None:
    dev, ivs = _unmeasured_stretch(method="instant,samples")
    s = _summary(ivs, dev)
    assert s["unmeasured_gpu_hours"] == 0.0 and s["idle_gpu_hours"] == pytest.approx(0.325)
    assert "unmeasured" not in format_summary(s)


def test_report_run_json_does_not_call_unmeasured_time_idle(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    dev, ivs = _unmeasured_stretch()
    rid = "0190aaaa-0000-7000-8000-0000000000f2"
    with Ledger(url) as ledger:
        ledger.create_run(_finished_run(rid, host="elsewhere", exit_code=0, meta={"cpu_count": 16}))
        ledger.add_devices(rid, [dev])
        ledger.append(rid, gpu=ivs, host=host_intervals(N, cores=lambda i: 2.0))
    import json

    out = CliRunner().invoke(cli, ["report", "run", rid, "--format", "json", "--no-history", "--db", url])
    assert out.exit_code == 0, out.output
    model = json.loads(out.stdout)
    assert "idle_gpus" not in {f["rule"] for f in model["findings"]}
    assert model["run"]["idle_gpu_hours"] == pytest.approx(0.075)
    card = next(c for c in model["cards"] if c["label"] == "Busy GPU-hours")
    assert "idle 0.0750" in card["detail"] and "unmeasured 0.250" in card["detail"]
