"""What tiering one live-ingested run day into ClickHouse now reads on top of the copy (issue 38).

A day that ``serve --series-live`` wrote is all held when retention tiers it, so ``lacking``
(store/series_live.py) looks its rows up by key and compares their rollups with the view's SELECT
over the raw rows (series/clickhouse_repair.py: nothing to repair here, the comparison only), and
the tier check then compares the day's rollups once more, read only (``short_rollups``). Both are
timed beside what the filter read before (every row of the run, through ``gpu_intervals``) and the
read-back the tier check already did (``series_tier.stored_summary``), on chDB,
for one node's GPUs with ``--days`` days of 5 s rows, tiering the last day.

    python benchmarks/tier_repair.py --gpus 8 --days 2 --rounds 5
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from gpuledger.series.clickhouse import ClickHouseSeries
from gpuledger.store import series_live, series_tier

DAY_S = 86_400
STEP = 5.0


def rows(gpus: int, first_day: int, days: int) -> list[dict[str, Any]]:
    """5 s intervals of ``gpus`` GPUs over ``days`` UTC days from day number ``first_day``."""
    out = []
    per_day = int(DAY_S / STEP)
    for g in range(gpus):
        for seq in range(per_day * days):
            t0 = first_day * DAY_S + seq * STEP
            out.append({
                "device_uuid": f"GPU-{g}", "seq": seq, "t0": t0, "t1": t0 + STEP, "samples": 5,
                "busy_s": 1.25 + seq % 3, "energy_j": 301.5 + seq % 7, "util_method": "samples",
                "energy_method": "counter",
            })  # fmt: skip
    return out


def timed(work: Callable[[], Any], rounds: int) -> dict[str, float]:
    took = []
    for _ in range(rounds):
        t = time.perf_counter()
        work()
        took.append((time.perf_counter() - t) * 1000)
    return {
        "min_ms": round(min(took), 1),
        "median_ms": round(statistics.median(took), 1),
        "max_ms": round(max(took), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--days", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    first = int(time.time()) // DAY_S - args.days  # inside the store's raw window
    with tempfile.TemporaryDirectory() as folder:
        store = ClickHouseSeries(f"chdb://{folder}/series", raw_days=30)
        store.create()
        everything = rows(args.gpus, first, args.days)
        for day in range(args.days):  # written live: one insert per GPU and day here
            for g in range(args.gpus):
                batch = [
                    r for r in everything if r["device_uuid"] == f"GPU-{g}" and int(r["t0"]) // DAY_S == first + day
                ]
                store.write("run", batch, [], token=f"live:{g}:{day}")
        last = first + args.days - 1
        tiered = [r for r in everything if int(r["t0"]) // DAY_S == last]
        expected = series_tier.day_summary(tiered, [])
        on = datetime.date(1970, 1, 1) + datetime.timedelta(days=last)
        assert series_live.lacking(store, "run", tiered, []) == ([], [])
        assert store.short_rollups("run", sorted(expected["gpu"]), on) == []
        out = {
            "gpus": args.gpus, "days": args.days, "rows_tiered": len(tiered), "rounds": args.rounds,
            "load": os.getloadavg()[0],
            "lacking (held by key + rollup comparison)": timed(
                lambda: series_live.lacking(store, "run", tiered, []), args.rounds
            ),
            "before: the run's rows read to leave out those held": timed(
                lambda: {(r["device_uuid"], r["seq"]) for r in store.gpu_intervals("run")}, args.rounds
            ),
            "short_rollups (tier check, read only)": timed(
                lambda: store.short_rollups("run", sorted(expected["gpu"]), on), args.rounds
            ),
            "stored_summary (the read-back already done)": timed(
                lambda: series_tier.stored_summary(store, "run", expected), args.rounds
            ),
            "repaired": store.rollups_repaired,
        }  # fmt: skip
        store.close()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
