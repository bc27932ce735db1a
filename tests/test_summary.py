"""Run summary: hand-computed figures, absent stays null, and the one-screen text."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuledger.core.metering.summary import REPLAY_BANNER, format_summary, summarize
from gpuledger.core.model import GpuIdentity, GpuInterval, HostInterval, RunRecord
from gpuledger.core.units import (
    fmt_bytes,
    fmt_duration,
    fmt_hours,
    fmt_kwh,
    fmt_pct,
    iso_utc,
    joules_to_kwh,
    seconds_to_hours,
)

T0 = 1_714_557_600.0  # 2024-05-01T10:00:00Z
A100 = GpuIdentity(index=0, uuid="GPU-a100-0", name="NVIDIA A100-SXM4-80GB", memory_total_b=80 * 2**30)
A100_1 = GpuIdentity(index=1, uuid="GPU-a100-1", name="NVIDIA A100-SXM4-80GB", memory_total_b=80 * 2**30)
GIB = 2**30


def _run(**kw: Any) -> RunRecord:
    base: dict[str, Any] = {
        "id": "0190c2f3-7b1e-7c3a-9f00-123456789abc",
        "command": ["yolo", "train", "model=yolov8n.pt", "data=coco128.yaml"],
        "user": "ml",
        "host": "gpu-node-1",
        "cwd": "/home/ml/proj",
        "started_at": T0,
        "name": "yolov8n-coco",
        "labels": {"team": "vision"},
        "git": {"commit": "3f786850e387550fdab836ed7e6dc881de23001b", "dirty": False},
        "versions": {"python": "3.11.7", "torch": "2.3.0"},
    }
    base.update(kw)
    return RunRecord(**base)


def _gpu_iv(uuid: str, seq: int, t0: float, t1: float, **kw: Any) -> GpuInterval:
    return GpuInterval(device_uuid=uuid, seq=seq, t0=T0 + t0, t1=T0 + t1, samples=5, **kw)


def _host_iv(seq: int, t0: float, t1: float, **kw: Any) -> HostInterval:
    return HostInterval(seq=seq, t0=T0 + t0, t1=T0 + t1, samples=5, **kw)


def _two_gpu_run() -> dict[str, Any]:
    """2 h on 2 A100s. GPU 0: 3 x 1800 busy-s, 3 x 1.2 MJ; GPU 1: 2 x 1800 busy-s, 1.8 MJ."""
    gpu = [
        _gpu_iv(A100.uuid, n, n * 2400, (n + 1) * 2400, busy_s=1800.0, energy_j=1.2e6, energy_method="counter",
                util_method="samples", power_max_w=350.0 + n, mem_used_max_b=(40 + n) * GIB,
                proc_mem_max_b=(38 + n) * GIB, util_max_pct=100.0, temp_max_c=70.0 + n,
                throttle_s={"power": 30.0})
        for n in range(3)
    ] + [
        _gpu_iv(A100_1.uuid, 0, 0, 3600, busy_s=1800.0, energy_j=0.9e6, energy_method="counter",
                util_method="instant", power_max_w=300.0, mem_used_max_b=20 * GIB, proc_mem_max_b=19 * GIB,
                util_max_pct=90.0, temp_max_c=65.0, throttle_s={}),
        _gpu_iv(A100_1.uuid, 1, 3600, 7200, busy_s=1800.0, energy_j=0.9e6, energy_method="power",
                util_method="samples", power_max_w=310.0, mem_used_max_b=21 * GIB, proc_mem_max_b=20 * GIB,
                util_max_pct=95.0, temp_max_c=66.0, throttle_s={"thermal": 12.0}),
    ]  # fmt: skip
    host = [
        _host_iv(0, 0, 3600, cpu_s=1000.0, rss_max_b=3 * GIB, read_b=10 * GIB, write_b=100 * 2**20),
        _host_iv(1, 3600, 7200, cpu_s=234.5, rss_max_b=4 * GIB, read_b=2 * GIB, write_b=50 * 2**20),
    ]
    run = _run(status="succeeded", ended_at=T0 + 7200, exit_code=0)
    return summarize(run, [A100_1, A100], gpu, host, now=T0 + 99_999)


def test_two_gpus_by_hand() -> None:
    s = _two_gpu_run()
    assert s["wall_seconds"] == 7200
    assert s["started_at"] == "2024-05-01T10:00:00.000Z" and s["ended_at"] == "2024-05-01T12:00:00.000Z"
    assert s["started_at_epoch"] == T0 and s["ended_at_epoch"] == T0 + 7200
    assert [g["index"] for g in s["gpus"]] == [0, 1]  # index order, whatever the device list order
    g0, g1 = s["gpus"]
    assert g0["busy_seconds"] == 5400 and g0["allocated_seconds"] == 7200 and g0["idle_seconds"] == 1800
    assert g0["mean_utilization"] == 0.75 and g1["mean_utilization"] == 0.5
    assert g0["energy_joules"] == pytest.approx(3.6e6) and g0["energy_kwh"] == pytest.approx(1.0)
    assert g0["peak_memory_bytes"] == 42 * GIB and g0["peak_process_memory_bytes"] == 40 * GIB
    assert g0["peak_power_watts"] == 352.0 and g0["max_temperature_c"] == 72.0
    assert g0["throttle_seconds"] == {"power": 90.0}
    assert g1["throttle_seconds"] == {"thermal": 12.0}
    assert g0["util_method"] == "samples" and g1["util_method"] == "instant,samples"
    assert g1["energy_method"] == "counter,power"
    assert s["allocated_gpu_hours"] == 4.0
    assert s["busy_gpu_hours"] == 2.5
    assert s["idle_gpu_hours"] == 1.5
    assert s["mean_utilization"] == 0.625
    assert s["energy_kwh"] == pytest.approx(1.5)
    assert s["peak_power_watts"] == 352.0
    assert s["peak_memory_bytes"] == 42 * GIB and s["peak_process_memory_bytes"] == 40 * GIB
    assert s["cpu_seconds"] == 1234.5 and s["peak_rss_bytes"] == 4 * GIB
    assert s["read_bytes"] == 12 * GIB and s["write_bytes"] == 150 * 2**20
    assert s["intervals"] == 3 and s["interval_seconds"] == 5.0
    assert s["replayed"] is False and s["gpu_note"] is None
    assert s["git"]["commit"].startswith("3f78") and s["labels"] == {"team": "vision"}
    json.dumps(s, allow_nan=False)


def test_design_seed_example() -> None:
    """The reference example: 6 h at 78 % mean utilisation on one A100 -> 4.68 busy GPU-hours."""
    ivs = [_gpu_iv(A100.uuid, n, n * 3600, (n + 1) * 3600, busy_s=0.78 * 3600) for n in range(6)]
    s = summarize(_run(status="succeeded", ended_at=T0 + 6 * 3600), [A100], ivs, [], now=T0)
    assert s["busy_gpu_hours"] == pytest.approx(4.68)
    assert s["allocated_gpu_hours"] == 6.0
    assert s["idle_gpu_hours"] == pytest.approx(1.32)
    assert s["gpus"][0]["mean_utilization"] == pytest.approx(0.78)


def test_run_without_gpu_has_null_gpu_figures_and_says_why() -> None:
    note = "NVML library not found: install the NVIDIA driver, or run with --no-gpu"
    run = _run(status="failed", ended_at=T0 + 65, exit_code=1, status_reason="exit code 1", gpu_note=note)
    s = summarize(run, [], [], [_host_iv(0, 0, 65, cpu_s=60.0, rss_max_b=GIB, read_b=1536, write_b=0)], now=T0)
    assert s["gpus"] == []
    for key in ("allocated_gpu_hours", "busy_gpu_hours", "idle_gpu_hours", "energy_kwh", "peak_power_watts",
                "mean_utilization", "peak_memory_bytes"):  # fmt: skip
        assert s[key] is None, key
    text = format_summary(s)
    assert note in text
    assert "GPU 0" not in text and "GPU-hours" not in text
    assert "failed (exit 1): exit code 1" in text
    assert "0:01:05" in text and "1.50 KiB" in text and "1.00 GiB" in text


def test_lost_run_ends_at_its_last_measurement() -> None:
    run = _run(status="lost", status_reason="recorder died (pid 4242)", ended_at=T0 + 9999)
    gpu = [_gpu_iv(A100.uuid, 0, 0, 5, busy_s=5.0), _gpu_iv(A100.uuid, 1, 5, 10, busy_s=2.5)]
    host = [_host_iv(0, 0, 5, cpu_s=1.0), _host_iv(1, 5, 10, cpu_s=1.0), _host_iv(2, 10, 12, cpu_s=0.5)]
    s = summarize(run, [A100], gpu, host, now=T0 + 50_000)
    assert s["wall_seconds"] == 12.0
    assert s["gpus"][0]["allocated_seconds"] == 12.0 and s["gpus"][0]["busy_seconds"] == 7.5
    assert s["status"] == "lost" and s["status_reason"] == "recorder died (pid 4242)"
    assert s["intervals"] == 3


def test_running_run_counts_up_to_now() -> None:
    s = summarize(_run(), [A100], [_gpu_iv(A100.uuid, 0, 0, 5, busy_s=1.0)], [], now=T0 + 90)
    assert s["wall_seconds"] == 90 and s["ended_at"] is None and s["ended_at_epoch"] is None
    assert s["cpu_seconds"] is None and s["peak_rss_bytes"] is None  # no host intervals yet


def test_absent_energy_stays_null() -> None:
    run = _run(status="succeeded", ended_at=T0 + 10)
    gpu = [
        _gpu_iv(A100.uuid, 0, 0, 10, busy_s=4.0),  # this GPU cannot report energy
        _gpu_iv(A100_1.uuid, 0, 0, 5, busy_s=1.0, energy_j=None),
        _gpu_iv(A100_1.uuid, 1, 5, 10, busy_s=1.0, energy_j=720.0),
    ]
    s = summarize(run, [A100, A100_1], gpu, [], now=T0)
    g0, g1 = s["gpus"]
    assert g0["energy_joules"] is None and g0["energy_kwh"] is None and g0["energy_method"] is None
    assert g1["energy_joules"] == 720.0
    assert s["energy_kwh"] == pytest.approx(720 / 3.6e6)
    assert g0["peak_power_watts"] is None and g0["throttle_seconds"] is None
    s = summarize(run, [A100], gpu[:1], [], now=T0)
    assert s["energy_kwh"] is None and s["peak_power_watts"] is None
    assert "n/a" in format_summary(s)


def test_gpu_without_intervals_is_listed_with_null_usage() -> None:
    s = summarize(_run(status="killed", signal=9, ended_at=T0 + 3), [A100], [], [], now=T0)
    g = s["gpus"][0]
    assert g["busy_seconds"] is None and g["mean_utilization"] is None and g["allocated_seconds"] == 3.0
    assert s["allocated_gpu_hours"] == pytest.approx(3 / 3600) and s["busy_gpu_hours"] is None
    assert "killed (signal 9)" in format_summary(s)


def test_intervals_of_an_unlisted_device_still_count() -> None:
    s = summarize(_run(status="succeeded", ended_at=T0 + 10), [], [_gpu_iv("GPU-x", 0, 0, 10, busy_s=3.0)], [], T0)
    assert [(g["uuid"], g["index"], g["busy_seconds"]) for g in s["gpus"]] == [("GPU-x", None, 3.0)]


def test_replayed_runs_are_marked() -> None:
    replay = GpuIdentity(index=0, uuid="GPU-replay", name="NVIDIA H100 80GB HBM3", source="replay")
    s = summarize(_run(status="succeeded", ended_at=T0 + 5), [replay], [], [], now=T0)
    assert s["replayed"] is True
    assert REPLAY_BANNER in format_summary(s)
    assert summarize(_run(replayed=True), [], [], [], now=T0)["replayed"] is True


def test_nan_measurements_become_null() -> None:
    gpu = [_gpu_iv(A100.uuid, 0, 0, 5, busy_s=1.0, power_max_w=float("nan"))]
    s = summarize(_run(status="succeeded", ended_at=T0 + 5), [A100], gpu, [], now=T0)
    assert s["gpus"][0]["peak_power_watts"] is None
    json.dumps(s, allow_nan=False)


def test_format_fits_one_screen_with_one_line_per_gpu() -> None:
    s = _two_gpu_run()
    text = format_summary(s)
    lines = text.splitlines()
    assert len(lines) <= 25
    gpu_lines = [line for line in lines if line.startswith("  GPU ") and "GPU-a100" in line]
    assert len(gpu_lines) == 2
    assert "NVIDIA A100-SXM4-80GB" in gpu_lines[0] and "GPU-a100-0" in gpu_lines[0]
    assert "succeeded (exit 0)" in lines[0] and "yolov8n-coco" in lines[0]
    for expected in ("2:00:00", "allocated 4.00", "busy 2.50", "idle 1.50", "mean 62%", "peak 100%",
                     "42.0 GiB device", "40.0 GiB this run", "1.50 kWh", "352 W", "1,235 s",
                     "4.00 GiB", "read 12.0 GiB", "written 150 MiB", "busy 75%"):  # fmt: skip
        assert expected in text, expected
    assert REPLAY_BANNER not in text


def test_busy_time_the_samples_could_not_cover_is_said() -> None:
    gpu = [
        _gpu_iv(A100.uuid, 0, 0, 60, busy_s=30.0, util_method="samples", util_idle_s=20.0, util_unknown_s=0.0),
        _gpu_iv(A100.uuid, 1, 60, 120, busy_s=40.0, util_method="instant,samples", util_idle_s=0.0,
                util_unknown_s=12.5),
        _gpu_iv(A100_1.uuid, 0, 0, 120, busy_s=None, util_method=None),
    ]  # fmt: skip
    s = summarize(_run(status="succeeded", ended_at=T0 + 120), [A100, A100_1], gpu, [], now=T0 + 200)
    g0 = s["gpus"][0]
    assert (g0["util_idle_seconds"], g0["util_unknown_seconds"]) == (20.0, 12.5)
    text = format_summary(s)
    assert "12.5 s of GPU time the samples could not cover (measured by the instant reading)" in text
    assert "GPU 1: busy time not reported by the driver (absent, not 0)" in text
    plain = summarize(_run(status="succeeded", ended_at=T0 + 120), [A100], gpu[:1], [], now=T0 + 200)
    assert "measured" not in format_summary(plain)  # nothing to say when the samples covered it all


# -- units --------------------------------------------------------------------------------------


def test_units() -> None:
    assert [fmt_bytes(v) for v in (None, 0, 1023, 1536, 10 * GIB, 150 * 2**20, 3 * 2**40)] == [
        "n/a", "0 B", "1023 B", "1.50 KiB", "10.0 GiB", "150 MiB", "3.00 TiB",
    ]  # fmt: skip
    assert [fmt_duration(v) for v in (None, 0, 0.412, 59.6, 59.97, 3723, 26 * 3600 + 187)] == [
        "n/a", "0 s", "0.412 s", "59.6 s", "0:01:00", "1:02:03", "26:03:07",
    ]  # fmt: skip
    assert (fmt_hours(4.68), fmt_hours(0.0042), fmt_hours(0.0), fmt_hours(None)) == ("4.68", "0.00420", "0", "n/a")
    assert (fmt_kwh(1.5), fmt_kwh(0.0002), fmt_kwh(None)) == ("1.50 kWh", "0.000200 kWh", "n/a")
    assert (fmt_pct(0.625), fmt_pct(None), fmt_pct(float("nan"))) == ("62%", "n/a", "n/a")
    assert iso_utc(0) == "1970-01-01T00:00:00.000Z" and iso_utc(None) is None
    assert seconds_to_hours(5400) == 1.5 and joules_to_kwh(3.6e6) == 1.0 and joules_to_kwh(None) is None
