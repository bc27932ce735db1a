"""Trace header keys select the scripted NVML's hardware behaviours; bad keys say file, line and key.

These tests parse traces and read the resulting fake through the pynvml-shaped API only: no
collector is involved.
"""

from __future__ import annotations

import json
from pathlib import Path

import pynvml
import pytest

from gpuledger.collect.fake_nvml import FakeNvml
from gpuledger.collect.replay import TraceError, load_trace, packaged_traces

UTIL = pynvml.NVML_GPU_UTILIZATION_SAMPLES


class Clock:
    def __init__(self, t: float = 500.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def write(tmp_path: Path, gpu: dict, points: list[dict]) -> Path:
    path = tmp_path / "t.jsonl"
    lines = [{"gpus": [{"uuid": "GPU-x", **gpu}]}, *({"gpu": 0, **p} for p in points)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def replay(path: Path | str, **kw) -> tuple[FakeNvml, object, Clock]:
    _, gpus = load_trace(path)
    clock = Clock()
    fake = FakeNvml(gpus, clock=clock, start=clock.t, **kw)
    fake.nvmlInit()
    return fake, fake.nvmlDeviceGetHandleByIndex(0), clock


def test_packaged_traces_load() -> None:
    assert {"a100x2-example", "h100-idle-example"} <= set(packaged_traces())
    for name in packaged_traces():
        _, gpus = load_trace(name)
        assert gpus and all(g.points for g in gpus), name


def test_packaged_h100_trace_goes_quiet_while_idle_and_fails_one_call() -> None:
    fake, h, clock = replay("h100-idle-example")
    assert fake.nvmlDeviceGetArchitecture(h) == pynvml.NVML_DEVICE_ARCH_HOPPER
    clock.t += 39.0  # epoch 1 ended at 38 s
    _, busy = fake.nvmlDeviceGetSamples(h, UTIL, 0)
    assert busy[-1].sampleValue.uiVal > 0
    clock.t += 11.9  # evaluation: the GPU is idle, the H100 takes no sample
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetSamples(h, UTIL, busy[-1].timeStamp)
    clock.t += 10.0  # t = 60.9: the energy counter fails for three seconds, power still answers
    with pytest.raises(pynvml.NVMLError_Unknown):
        fake.nvmlDeviceGetTotalEnergyConsumption(h)
    assert fake.nvmlDeviceGetPowerUsage(h) > 500_000
    clock.t += 3.0
    assert fake.nvmlDeviceGetTotalEnergyConsumption(h) > 0


def test_behaviour_keys_reach_the_fake(tmp_path: Path) -> None:
    gpu = {
        "name": "NVIDIA H100 80GB HBM3", "profile": "volta", "sampling": "stop", "buffer_len": 5,
        "energy_update_s": 0.5, "power_average_s": 2.0, "sample_phase_s": 0.0, "host_pid_offset": 100,
        "pid_translation": "lists", "unsupported_fields": [186], "process_quirks": ["stale"], "minor_number": 4,
        "failing": [{"call": "nvmlDeviceGetTemperature", "from": 1000, "to": 1002}, {"field": 83}],
    }  # fmt: skip
    points = [
        {"t": 1000, "util_pct": 50, "power_w": 100, "temp_c": 40, "procs": {"run": {"mem_b": 9, "sm_pct": 5}}},
        {"t": 1001, "power_w": 300},
    ]
    fake, h, clock = replay(write(tmp_path, gpu, points))
    fake.run_pids = {7}
    assert fake.nvmlDeviceGetArchitecture(h) == pynvml.NVML_DEVICE_ARCH_VOLTA  # the profile overrides the name
    assert fake.nvmlDeviceGetMinorNumber(h) == 4
    clock.t += 1.5
    with pytest.raises(pynvml.NVMLError_Unknown):  # failing from t=1000 (trace axis) for 2 s
        fake.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    assert fake.nvmlDeviceGetPowerUsage(h) == 150_000  # 2 s average: (100 W x 1.5 s + 300 W x 0.5 s) / 2 s
    readings = set()
    for _ in range(50):  # half a second of readings: one step of 0.5 s at 300 W, at most
        readings.add(fake.nvmlDeviceGetTotalEnergyConsumption(h))
        clock.t += 0.01
    assert len(readings) <= 2 and (len(readings) == 1 or max(readings) - min(readings) == 150_000)
    clock.t -= 0.5
    ids = [pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]
    instant, energy = fake.nvmlDeviceGetFieldValues(h, ids)
    assert instant.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED and energy.nvmlReturn == pynvml.NVML_ERROR_UNKNOWN
    _, got = fake.nvmlDeviceGetSamples(h, UTIL, 0)
    assert len(got) == 5 and got[-1].timeStamp == 501_000_000  # period 1 s (volta), phase 0, five kept
    assert [p.pid for p in fake.nvmlDeviceGetComputeRunningProcesses(h)] == [7]  # lists translated
    first = fake.nvmlDeviceGetProcessUtilization(h, 0)
    assert [s.pid for s in first] == [107]  # samples keep host pids
    assert fake.nvmlDeviceGetProcessUtilization(h, first[0].timeStamp)  # stale samples come back
    clock.t += 1.0
    assert fake.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 40  # the window is over


def test_mig_slice_keys(tmp_path: Path) -> None:
    gpu = {"mig": [{"uuid": "MIG-a", "profile": "1g.10gb", "gi": 9, "ci": 1, "process_memory": True}]}
    path = write(tmp_path, gpu, [{"t": 0, "power_w": 50}])
    fake, h, _ = replay(path)
    mh = fake.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert (fake.nvmlDeviceGetGpuInstanceId(mh), fake.nvmlDeviceGetComputeInstanceId(mh)) == (9, 1)


@pytest.mark.parametrize(
    ("gpu", "points", "message"),
    [
        ({"profile": "h100"}, [], "t.jsonl:1: gpu 0: 'profile' must be one of hopper, "),
        ({"sampling": "sometimes"}, [], "t.jsonl:1: gpu 0: 'sampling' must be one of grid, slow, stop"),
        ({"buffer_len": 0}, [], "t.jsonl:1: gpu 0: 'buffer_len' must be at least 1, got 0"),
        ({"buffer_len": "100"}, [], "t.jsonl:1: gpu 0: 'buffer_len' must be a whole number, got '100'"),
        ({"energy_update_s": -1}, [], "t.jsonl:1: gpu 0: 'energy_update_s' must be at least 0.0, got -1"),
        ({"host_pid_offset": 1.5}, [], "t.jsonl:1: gpu 0: 'host_pid_offset' must be a whole number"),
        ({"pid_translation": "all"}, [], "t.jsonl:1: gpu 0: 'pid_translation' must be one of none, lists"),
        ({"failing": [{"call": "GetPower"}]}, [], "t.jsonl:1: gpu 0 failing 0: 'call' must be an NVML function"),
        ({"failing": [{"field": 83, "call": "nvmlInit"}]}, [], "t.jsonl:1: gpu 0 failing 0: give one of"),
        ({"failing": [{"field": 83, "until": 4}]}, [], "t.jsonl:1: gpu 0 failing 0: unknown field(s) until"),
        ({"process_quirks": ["odd"]}, [], "t.jsonl:1: gpu 0: 'process_quirks' has unknown value(s) odd"),
        ({"unsupported_fields": ["186"]}, [], "t.jsonl:1: gpu 0: 'unsupported_fields' must list field ids"),
        ({"lost": [[5]]}, [], "t.jsonl:1: gpu 0 lost: each window is [from, to]"),
        ({"mig": [{"profile": "1g.10gb"}]}, [], "t.jsonl:1: gpu 0 mig 0: missing 'uuid'"),
        ({"mig": [{"uuid": "MIG-a", "gi": -1}]}, [], "t.jsonl:1: gpu 0 mig 0: 'gi' must be at least 0"),
        ({}, [{"t": 0, "throttle": ["powr"]}], "t.jsonl:2: 'throttle' has unknown value(s) powr"),
        ({}, [{"t": "0"}], "t.jsonl:2: 't' must be a number, got '0'"),
        ({}, [{"t": 0, "util_pct": 130}], "t.jsonl:2: 'util_pct' is a percentage, got 130"),
        ({}, [{"t": 0, "procs": {"me": {"mem_b": 1}}}], "t.jsonl:2: process key 'me' is neither a pid"),
        ({}, [{"t": 0, "procs": {"run": {"mem": 1}}}], "t.jsonl:2 process run: unknown field(s) mem"),
    ],
)
def test_bad_keys_say_file_line_and_key(tmp_path: Path, gpu: dict, points: list[dict], message: str) -> None:
    with pytest.raises(TraceError) as err:
        load_trace(write(tmp_path, gpu, points))
    assert str(err.value).startswith(message)
