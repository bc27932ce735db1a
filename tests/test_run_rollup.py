"""Summaries from SQL rollups equal summaries from every interval (so `show` stays fast and right)."""

from __future__ import annotations

import random

import pytest

from gpuledger.core.metering.summary import summarize
from gpuledger.core.model import GpuIdentity, GpuInterval, HostInterval, RunRecord
from gpuledger.runs.view import summary
from gpuledger.store import Ledger


def _run() -> RunRecord:
    return RunRecord(
        id="0190abcd-0001-7000-8000-000000000001",
        command=["train"],
        user="u",
        host="h",
        cwd="/",
        started_at=1000.0,
        ended_at=1100.0,
        status="succeeded",
    )


def _intervals(rng: random.Random) -> tuple[list[GpuInterval], list[HostInterval]]:
    gpu, host = [], []
    for uuid in ("GPU-a", "GPU-b"):
        for seq in range(40):
            t0 = 1000.0 + seq * 2.5
            gpu.append(GpuInterval(
                device_uuid=uuid, seq=seq, t0=t0, t1=t0 + 2.5, samples=5,
                busy_s=rng.uniform(0, 2.5), util_method="samples" if seq % 7 else "instant",
                util_max_pct=rng.uniform(0, 100), energy_j=rng.uniform(100, 900) if seq % 5 else None,
                energy_method="counter" if seq % 5 else None, power_max_w=rng.uniform(50, 400),
                mem_used_max_b=rng.randrange(2**34), mem_used_last_b=rng.randrange(2**34),
                mem_reserved_b=2**20, proc_mem_max_b=rng.randrange(2**33),
                proc_sm_util_avg_pct=rng.uniform(0, 100) if seq % 3 else None, temp_max_c=rng.uniform(30, 80),
                sm_clock_avg_mhz=rng.uniform(800, 1900), mem_clock_max_mhz=1593.0,
                throttle_s={"power": rng.uniform(0, 1)} if seq % 4 == 0 else None,
            ))  # fmt: skip
    for seq in range(40):
        t0 = 1000.0 + seq * 2.5
        host.append(HostInterval(
            seq=seq, t0=t0, t1=t0 + 2.5, samples=5, cpu_s=rng.uniform(0, 5), rss_max_b=rng.randrange(2**32),
            read_b=rng.randrange(2**20), write_b=rng.randrange(2**20), threads_max=12, procs_max=3,
            sys_cpu_util_avg_pct=rng.uniform(0, 100), iowait_s=rng.uniform(0, 1), sys_mem_used_max_b=2**33,
            disk_read_b=10, disk_write_b=20, net_rx_b=30, net_tx_b=40,
        ))  # fmt: skip
    return gpu, host


def test_rollup_summary_equals_the_interval_summary(ledger_url: str) -> None:
    run = _run()
    devices = [
        GpuIdentity(index=0, uuid="GPU-a", name="NVIDIA A100-SXM4-80GB"),
        GpuIdentity(index=1, uuid="GPU-b", name="NVIDIA A100-SXM4-80GB"),
    ]
    gpu, host = _intervals(random.Random(7))
    with Ledger(ledger_url) as ledger:
        ledger.create_run(run)
        ledger.add_devices(run.id, devices)
        ledger.append(run.id, gpu, host)
        fast = summary(ledger, ledger.get_run(run.id), now=2000.0)
        slow = summarize(ledger.get_run(run.id), devices, gpu, host, now=2000.0)
    assert fast.keys() == slow.keys()
    for key in fast:
        if key == "gpus":
            continue
        assert fast[key] == pytest.approx(slow[key]), key
    for f, s in zip(fast["gpus"], slow["gpus"], strict=True):
        for key in s:
            expected = pytest.approx(s[key], rel=1e-9) if isinstance(s[key], float | dict) else s[key]
            assert f[key] == expected, (f["uuid"], key)
