"""What the diagnosis and the run summary do with what was not measured: an unknown core count
(a report made on another host) and GPU time the driver's samples could not cover with no instant
reading (util_unknown_s, docs/METERING.md). Neither may be read as a fact."""

from __future__ import annotations

from diag_support import device, gpu_intervals, host_intervals, make_trace
from gpuledger.core.diagnosis.diagnose import diagnose


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
