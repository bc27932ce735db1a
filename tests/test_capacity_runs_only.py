"""A GPU known only from the runs recorded on it (a wrapped-only deployment, no agent), on SQLite
and PostgreSQL: it is in the fleet from its first run's start to its last run's end, so a month
with no run on it is all unallocated time, and monthly reports add up to the quarter's."""

from __future__ import annotations

from cost_support import card, ts
from gpuledger.core.capacity.pools import Pools
from gpuledger.core.model import GpuIdentity, GpuInterval, RunRecord
from gpuledger.reports.capacity.report import capacity
from gpuledger.store import Ledger

H = 3600.0
T4 = card('[[gpu]]\nmodel = "T4"\nprice_per_hour = "0.50"\n')


def test_a_month_between_two_runs_is_the_gpus_unallocated_time(ledger_url: str) -> None:
    with Ledger(ledger_url) as led:
        for rid, start in (("jan", ts("2026-01-10")), ("mar", ts("2026-03-10"))):
            led.create_run(RunRecord(id=rid, command=["x"], user="u", host="ws-1", cwd="/", started_at=start,
                                     ended_at=start + 2 * H, status="succeeded", labels={"team": "t"}))  # fmt: skip
            led.add_devices(rid, [GpuIdentity(0, "GPU-ws", "Tesla T4")])
            hours = [GpuInterval("GPU-ws", k, start + k * H, start + (k + 1) * H, busy_s=H / 2) for k in (0, 1)]
            led.append(rid, hours)

        def total(a: str, b: str) -> dict:  # type: ignore[type-arg]
            return capacity(led, card=T4, pools=Pools(), start=ts(a), end=ts(b)).total

        february = total("2026-02-01", "2026-03-01")
        assert (february["fleet_gpu_h"], february["unallocated_gpu_h"]) == (672.0, 672.0)  # 28 days, no run
        months = [total("2026-01-01", "2026-02-01"), february, total("2026-03-01", "2026-04-01")]
        quarter = total("2026-01-01", "2026-04-01")
        assert sum(m["fleet_gpu_h"] for m in months) == quarter["fleet_gpu_h"] == 1418.0
