"""The capacity report over a simulated 1,024-GPU fleet, a month and a year, on SQLite and PostgreSQL.

    python benchmarks/capacity.py                        # 500,000 runs, SQLite and PostgreSQL
    python benchmarks/capacity.py --runs 50000 --backends sqlite

Data: the chargeback benchmark's year (benchmarks/chargeback.py: 128 nodes x 8 GPUs, 500,000 runs
placed on the nodes' GPUs, stored rolled up), with each run's devices named by the physical GPU
they ran on, plus what node agents at the default 10 s interval would have left in the capacity
ledger: the fleet (1,024 GPUs with their hosts, instance types on the cloud nodes) and the per GPU,
day and host sums (``gpu_capacity_days``, 373,760 rows for the year) that the agents' writes keep
current — held time from the runs, busy from their utilisation, a little busy time with no owner.
The raw intervals those sums stand for (a year at 10 s: 3.2 billion rows) are not loaded: the
report never reads them. The agent's own write is timed separately (one interval of 8 GPUs).

Timed (median of 3 calls, wall and this process's CPU): ``report capacity`` for June 2026 and for
the year, by host without sharing and by pool with the unbilled cost shared by allocated hours.
Targets (issue 13): a month under 2 s, a year under 10 s.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
import uuid as uuidlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from chargeback import NODES, RATES, TABLES, YEAR0, YEAR1, _flush, _pg_schema, _pg_writer, _sqlite_writer, generate

from gpuledger.core.capacity.model import DAY_MS, CapacityInterval, Sighting, States
from gpuledger.core.capacity.pools import parse_pools
from gpuledger.core.pricing.ratecard_load import parse_rate_card
from gpuledger.reports.capacity.report import capacity
from gpuledger.reports.cost.costing import month_window, window_from_args
from gpuledger.store import Ledger
from gpuledger.store.capacity import write_capacity

POOLS = """
[[pool]]
name = "a100-cloud"
hosts = ["node00*", "node01*", "node02*", "node030", "node031"]
instance_type = "p4d.24xlarge"

[[pool]]
name = "training"
hosts = ["node03[2-9]", "node0[4-7]*", "node08[0-7]"]
"""
DAY_COLUMNS = ["gpu_uuid", "day", "host", "first_ms", "last_ms", "unallocated_ms", "alloc_idle_ms", "busy_attr_ms",
               "busy_unattr_ms", "unmeasured_ms", "energy_j", "intervals"]  # fmt: skip
FLEET_COLUMNS = ["uuid", "name", "host", "first_seen", "last_seen", "instance_type", "memory_total_b"]
HOST_COLUMNS = ["uuid", "host", "first_seen", "last_seen"]


def fleet_nodes() -> list[tuple[str, str, str | None]]:
    """(host, NVML name, instance type) per node, in the chargeback generator's order."""
    out = []
    for name, _, count, instance in NODES:
        out += [(f"node{len(out):03d}", name, instance) for _ in range(count)]
    return out


def load(url: str, n_runs: int) -> dict[str, int]:
    """The chargeback benchmark's runs (devices renamed to the physical GPU), the fleet, the day sums."""
    Ledger(url).close()  # the schema
    writer = _sqlite_writer(url) if url.startswith("sqlite") else _pg_writer(url)
    counts = dict.fromkeys(("runs", "run_labels", "devices", "gpu_rollups"), 0)
    buffers: dict[str, list[dict]] = {t: [] for t, _ in TABLES}
    held: dict[tuple[str, int], list[float]] = {}  # (gpu, day) -> [held s, busy s]
    for run, labels, devices, rollups in generate(n_runs):
        for d in devices:
            d["uuid"] = d["uuid"].rsplit("-", 1)[0]  # GPU-<node>-<slot>: the physical GPU
        util = rollups[0]["busy_s"] / rollups[0]["alloc_s"] if rollups and rollups[0]["alloc_s"] else 0.0
        for r in rollups:
            seconds = r["t1"] - r["t0"]
            for d in devices:
                acc = held.setdefault((d["uuid"], r["day"]), [0.0, 0.0])
                acc[0] += seconds
                acc[1] += seconds * util
        buffers["runs"].append(run)
        buffers["run_labels"] += labels
        buffers["devices"] += devices
        buffers["gpu_rollups"] += rollups
        if len(buffers["runs"]) >= 20000:
            _flush(writer, buffers, counts)
    _flush(writer, buffers, counts)
    fleet, hosts, days = [], [], []
    watts = {name: w for name, w, _, _ in NODES}
    first_day, last_day = int(YEAR0 // 86400), int(YEAR1 // 86400) - 1
    for node, (host, name, instance) in enumerate(fleet_nodes()):
        for slot in range(8):
            uuid = f"GPU-{node:03d}-{slot}"
            fleet.append({"uuid": uuid, "name": name, "host": host, "first_seen": YEAR0, "last_seen": YEAR1,
                          "instance_type": instance, "memory_total_b": 80 * 2**30})  # fmt: skip
            hosts.append({"uuid": uuid, "host": host, "first_seen": YEAR0, "last_seen": YEAR1})
            for day in range(first_day, last_day + 1):
                h, b = held.get((uuid, day), (0.0, 0.0))
                held_ms = min(DAY_MS, round(h * 1000))
                busy = min(held_ms, round(b * 1000))
                stray = min(DAY_MS - held_ms, 60_000 * (day % 7))  # minutes of work nobody owns
                states = {"unallocated_ms": DAY_MS - held_ms - stray, "alloc_idle_ms": held_ms - busy,
                          "busy_attr_ms": busy, "busy_unattr_ms": stray, "unmeasured_ms": 0}  # fmt: skip
                days.append({"gpu_uuid": uuid, "day": day, "host": host, "first_ms": day * DAY_MS,
                             "last_ms": (day + 1) * DAY_MS, **states, "energy_j": 86400 * watts[name] * 0.5,
                             "intervals": 8640})  # fmt: skip
    for table, cols, rows in (("gpu_fleet", FLEET_COLUMNS, fleet), ("gpu_fleet_hosts", HOST_COLUMNS, hosts),
                              ("gpu_capacity_days", DAY_COLUMNS, days)):  # fmt: skip
        for i in range(0, len(rows), 50000):
            writer(table, (cols, rows[i : i + 50000]))
        counts[table] = len(rows)
    writer(None, None)
    return counts


def timed(fn, repeat: int = 3):  # type: ignore[no-untyped-def]
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus), result


def bench(url: str, label: str) -> None:
    card = parse_rate_card(RATES, "benchmark card")
    pools = parse_pools(POOLS, "benchmark pools")
    led = Ledger(url)
    month = month_window("2026-06")
    year = window_from_args(None, "2026-01-01", "2026-12-31", 0)
    for what, (lo, hi), by, rule in (
        ("month 2026-06 by host", month, ("host",), "none"),
        ("month 2026-06 by pool, shared by allocated", month, ("pool",), "allocated"),
        ("year 2026 by host", year, ("host",), "none"),
        ("year 2026 by pool, shared by allocated", year, ("pool",), "allocated"),
    ):
        wall, cpu, report = timed(
            lambda lo=lo, hi=hi, by=by, rule=rule: capacity(
                led, card=card, pools=pools, start=lo, end=hi, by=by, share_rule=rule
            )
        )
        t = report.total  # type: ignore[attr-defined]
        note = f"{t['gpus']:,} GPUs, {t['fleet_gpu_h']:,.0f} GPU-h, busy {t['busy_share']:.1%}"
        note += f", cost {t['fleet_cost'][:12]}"
        print(f"  {label:10} {what:46} {wall:6.2f} s wall {cpu:6.2f} s CPU   ({note})", flush=True)
    led.close()


def agent_write(url: str) -> None:
    """One agent interval (8 GPUs, 10 s) written as the agent's ledger thread writes it."""
    led = Ledger(url)
    t0 = int(YEAR1 * 1000) + 10 * DAY_MS
    tag = uuidlib.uuid4().hex[:8]  # new GPUs each call: a kept ledger must not turn this into a replay
    walls = []
    for k in range(50):
        a = t0 + k * 10_000
        states = States(1000, 2000, 6000, 1000)
        ivs = [CapacityInterval(f"GPU-{tag}-{g}", "writer", a, a + 10_000, states) for g in range(8)]
        sights = [Sighting(f"GPU-{tag}-{g}", "NVIDIA H100 80GB HBM3", "writer", a / 1000, (a + 10_000) / 1000)
                  for g in range(8)]  # fmt: skip
        t = time.perf_counter()
        led.write(lambda c, ivs=ivs, sights=sights: write_capacity(led.database, c, ivs, sights))
        walls.append(time.perf_counter() - t)
    led.close()
    median, p95 = statistics.median(walls) * 1000, sorted(walls)[int(0.95 * len(walls))] * 1000
    print(f"  agent write: one 10 s interval of 8 GPUs (+ day sums, fleet) median {median:.1f} ms, p95 {p95:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=500_000)
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument(
        "--pg-url", default=os.environ.get("GPULEDGER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
    )
    ap.add_argument("--keep", metavar="DIR", help="keep the SQLite file in DIR (and reuse it if it is there)")
    ap.add_argument("--pg-schema", metavar="NAME", help="use (and keep) this PostgreSQL schema; loaded if empty")
    args = ap.parse_args()
    gpus = sum(n for _, _, n, _ in NODES) * 8
    print(f"capacity benchmark: {gpus:,} GPUs over 2026, {args.runs:,} runs; {math.ceil(YEAR1 - YEAR0) // 86400} days",
          flush=True)  # fmt: skip
    for backend in args.backends.split(","):
        if backend == "sqlite":
            folder = Path(args.keep or tempfile.mkdtemp(prefix="gl-cap-"))
            path = folder / f"capacity-{args.runs}.db"
            url = f"sqlite:///{path}"
            if not path.exists():
                t = time.perf_counter()
                counts = load(url, args.runs)
                print(f"  sqlite     loaded {counts} in {time.perf_counter() - t:.0f} s", flush=True)
            bench(url, "sqlite")
            agent_write(url)
            if not args.keep:
                path.unlink()
        elif backend == "postgres":
            url, drop, fresh = _pg_schema(args.pg_url, args.pg_schema)
            try:
                if fresh:
                    t = time.perf_counter()
                    counts = load(url, args.runs)
                    print(f"  postgres   loaded {counts} in {time.perf_counter() - t:.0f} s", flush=True)
                bench(url, "postgres")
                agent_write(url)
            finally:
                if not args.pg_schema:
                    drop()


if __name__ == "__main__":
    main()
