"""One ledger for the screen tests: a month (March 2026) of a small fleet, weeks of YOLO trainings
with a value anomaly, earlier months for the trend, and the awkward cases a manager's screen must
get right: a team whose bill is under a cent, a long team name, and runs without a name."""

from __future__ import annotations

from pathlib import Path

import capacity_sim
import value_sim
from cost_support import ts
from gpuledger.core.model import GpuIdentity, GpuInterval, HostInterval, RunRecord
from gpuledger.reports.cost.rollups import materialise_rollups
from gpuledger.store import Ledger

MONTH = "2026-03"
A100 = "NVIDIA A100-SXM4-80GB"
# The rate card of every screen: the fleet's card (A100 80 GB bought, A100 40 GB, L4, T4 rented).
CARD_TEXT = f'[card]\ncurrency = "USD"\nbasis = "allocated"\n{capacity_sim.CARD_TEXT}'
TINY_TEAM = "platform"  # 10 s of one A100: well under a cent
LONG_TEAM = "research-infrastructure"
UNNAMED = "01951e2a-5b7c-7d3e-9f10-a1b2c3d4e5f6"  # short id: the last ten hex digits in base32
TINY_RUN = "01951e2a-0000-7000-8000-00000000aa01"  # 10 s: its charts' time axis is in seconds


def _run(led: Ledger, run_id: str, team: str, project: str, start: float, seconds: float, util: float, **kw) -> None:
    led.create_run(
        RunRecord(
            id=run_id,
            command=["python", "train.py"],
            user=kw.get("user", "bo"),
            host="gpu-box-2",
            cwd="/w",
            started_at=start,
            status="succeeded",
            ended_at=start + seconds,
            name=kw.get("name"),
            labels={"team": team, "project": project},
        )
    )
    uuid = f"GPU-{run_id[-12:]}"
    led.add_devices(run_id, [GpuIdentity(0, uuid, A100, memory_total_b=80 * 2**30)])
    step = min(seconds, 600.0)
    n = max(1, round(seconds / step))
    gpu = [
        GpuInterval(uuid, k, start + k * step, start + (k + 1) * step, samples=10, busy_s=util * step,
                    energy_j=250.0 * step, power_max_w=300.0, mem_used_max_b=2**34)
        for k in range(n)
    ]  # fmt: skip
    host = [HostInterval(k, start + k * step, start + (k + 1) * step, samples=10, cpu_s=0.02) for k in range(n)]
    led.append(run_id, gpu=gpu, host=host)


def seed(url: str) -> None:
    """The whole ledger at ``url`` (SQLite or PostgreSQL), rollups included (the trend reads them)."""
    capacity_sim.load(url)
    with Ledger(url) as led:
        value_sim.write(led, value_sim.simulate())
        _run(led, TINY_RUN, TINY_TEAM, "infra-tools", ts("2026-03-10"), 10.0, 0.3)
        _run(led, UNNAMED, LONG_TEAM, "cluster-benchmarks", ts("2026-03-11"), 24 * 3600.0, 0.55)  # in the TOP 10
        _run(led, "01951e2a-0000-7000-8000-00000000aa03", LONG_TEAM, "cluster-benchmarks", ts("2026-02-11"),
             5 * 3600.0, 0.6, name="scaling sweep")  # fmt: skip
        _run(led, "01951e2a-0000-7000-8000-00000000aa04", "vision", "detector", ts("2026-01-20"), 8 * 3600.0, 0.8)
        _run(led, "01951e2a-0000-7000-8000-00000000aa05", TINY_TEAM, "infra-tools", ts("2026-02-02"), 2 * 3600.0, 0.2)
        materialise_rollups(led)


def rates_file(folder: Path) -> Path:
    path = folder / "rates.toml"
    path.write_text(CARD_TEXT)
    return path
