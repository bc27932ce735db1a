"""Value trends (``gpuledger report value``'s figures) over a SQLite ledger of rolled-up runs.

    python benchmarks/value_trend.py --baseline DIR          # this tree and DIR's, in turn
    python benchmarks/value_trend.py --runs 400 --gpus 8 --hours 12 --rounds 5

Data: ``--runs`` finished YOLO trainings over the 8 weeks before 2026-04-06 (two model versions),
each on ``--gpus`` A100s for ``--hours`` hours, one GPU interval every ``--step`` seconds per GPU
(busy 80 %), written through the Ledger API, then ``gpuledger report rollup`` (materialise_rollups).
The rate card changes price at 21:00 on one day, so that day's runs are read from their intervals
for that day in any case. Timed: one ``value_trends`` call (8 weeks, by model_version), in a fresh
process per tree and round, trees alternating; min/median/max per tree. Nothing is asserted; the
figures of both trees are compared and their equality printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
END = 1775433600.0  # 2026-04-06 UTC, a Monday
WEEK = 7 * 86400
CARD = """
[card]
currency = "USD"
basis = "allocated"

[[gpu]]
model = "A100-80GB-SXM"
price_per_hour = "3.43"
effective_to = 2026-03-18T21:00:00

[[gpu]]
model = "A100-80GB-SXM"
price_per_hour = "2.90"
effective_from = 2026-03-18T21:00:00
"""


def build(path: str, runs: int, gpus: int, hours: float, step: float) -> int:
    from gpuledger.core.model import GpuIdentity, GpuInterval, RunRecord
    from gpuledger.reports.cost.rollups import materialise_rollups
    from gpuledger.store import Ledger

    n = round(hours * 3600 / step)
    first = END - 8 * WEEK
    gap = (8 * WEEK - hours * 3600) / runs
    with Ledger(f"sqlite:///{path}") as led:
        for i in range(runs):
            rid, t0 = f"run-{i:05d}", first + i * gap
            version = "yolov5m" if i % 2 else "yolo11n"
            labels = {"project": "det", "team": "vision", "model": version, "model_version": version}
            led.create_run(RunRecord(id=rid, command=["yolo"], user="ana", host="h", cwd="/", started_at=t0,
                                     status="succeeded", ended_at=t0 + n * step, labels=labels))  # fmt: skip
            uuids = [f"GPU-{i}-{g}" for g in range(gpus)]
            led.add_devices(rid, [GpuIdentity(g, u, "NVIDIA A100-SXM4-80GB") for g, u in enumerate(uuids)])
            ivs = [
                GpuInterval(u, k, t0 + k * step, t0 + (k + 1) * step, busy_s=0.8 * step, energy_j=300.0 * step)
                for u in uuids
                for k in range(n)
            ]
            led.append(rid, gpu=ivs)
        materialise_rollups(led)
    return runs * gpus * n


def child(path: str) -> None:
    """One timed value_trends call on the ledger at ``path`` with the code on sys.path; prints JSON."""
    from gpuledger.core.pricing.ratecard_load import parse_rate_card
    from gpuledger.reports.cost.value_trends import value_trends
    from gpuledger.store import Ledger

    card = parse_rate_card(CARD, "bench.toml")
    with Ledger(f"sqlite:///{path}") as led:
        t = time.perf_counter()
        trends = value_trends(led, scope=None, card=card, end=END, weeks=8)
        elapsed = time.perf_counter() - t
    print(json.dumps({"s": elapsed, "figures": trends.as_dict()["series"]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--hours", type=float, default=8.0)
    ap.add_argument("--step", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline", help="another source tree, timed in turn with this one")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    sys.path.insert(0, str(HERE.parent / "src"))
    from _common import machine_line, source_state, tree_child_json

    trees = {"this": str(HERE.parent)} | ({"baseline": args.baseline} if args.baseline else {})
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ledger.db")
        t = time.perf_counter()
        intervals = build(path, args.runs, args.gpus, args.hours, args.step)
        print(f"{args.runs} runs x {args.gpus} GPUs x {args.hours} h: {intervals} GPU intervals, "
              f"built and rolled up in {time.perf_counter() - t:.0f} s")  # fmt: skip
        times: dict[str, list[float]] = {name: [] for name in trees}
        figures: dict[str, object] = {}
        for _ in range(args.rounds):
            for name, tree in trees.items():
                out = tree_child_json(__file__, tree, [path])
                times[name].append(out["s"])
                figures[name] = out["figures"]
        print(machine_line())
        for name, tree in trees.items():
            xs = times[name]
            print(f"{name:8s} {source_state(tree)}: value_trends min {min(xs):.3f} s, "
                  f"median {statistics.median(xs):.3f} s, max {max(xs):.3f} s ({len(xs)} rounds)")  # fmt: skip
        if args.baseline:
            print("same figures:", figures["this"] == figures["baseline"])


if __name__ == "__main__":
    main()
