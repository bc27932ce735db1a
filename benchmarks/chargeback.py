"""Chargeback over a simulated year of a 1,024-GPU cluster, on SQLite and PostgreSQL.

    python benchmarks/chargeback.py                       # 500,000 runs, SQLite and PostgreSQL
    python benchmarks/chargeback.py --runs 50000 --backends sqlite
    python benchmarks/chargeback.py --pg-url postgresql://postgres@127.0.0.1:5432/test

Data: 128 nodes x 8 GPUs (A100 40/80 GB, H100, L4, T4, on-prem V100), jobs of 1-8 GPUs placed on
each node's free GPUs back to back over 2026 (about 75 % of the GPU-hours allocated), 5 teams,
12 projects, 200 users, 4 % killed / lost / failed, 1 % resumed attempts, some cloud instance
labels. Each run is stored as the ledger stores a finished run after ``gpuledger report rollup``:
its ``runs`` row (flagged rolled_up), labels, ``devices`` and ``gpu_rollups`` rows (one per run, GPU
model and UTC day, carrying the run's team, project, user and instance type) — no raw intervals
(a year of 5 s intervals would be ~4 billion rows). Rows go in with bulk inserts (executemany on
SQLite, COPY on PostgreSQL). Then the chargeback is timed: one month (with its
3-month trend) and the whole year, by team and by team, project, user and GPU model; the median
of 3 runs is printed. Targets (issue 4): month < 2 s, year < 10 s.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gpuledger.core.pricing.ratecard_load import parse_rate_card
from gpuledger.reports.cost.costing import chargeback, month_window, window_from_args
from gpuledger.store import Ledger

YEAR0, YEAR1 = 1767225600.0, 1798761600.0  # 2026-01-01 .. 2027-01-01 UTC
DAY = 86400
NODES = [  # (NVML name, watts, nodes, instance type label or None)
    ("NVIDIA A100-SXM4-40GB", 330.0, 32, "p4d.24xlarge"),
    ("NVIDIA A100-SXM4-80GB", 360.0, 32, None),
    ("NVIDIA H100 80GB HBM3", 600.0, 24, "p5.48xlarge"),
    ("NVIDIA L4", 65.0, 16, None),
    ("Tesla T4", 60.0, 8, None),
    ("Tesla V100-SXM2-16GB", 250.0, 16, None),
]
TEAMS = {
    "vision": ["det", "seg", "track"],
    "nlp": ["llm", "asr"],
    "research": ["rl", "gen", "theory"],
    "ops": ["infra", "eval"],
    "edge": ["tiny", "quant"],
}
RATES = """
[card]
name = "benchmark card"
currency = "USD"
basis = "busy"

[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "2.74"
effective_to = 2026-06-16

[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "2.50"
effective_from = 2026-06-16

[[gpu]]
model = "A100-80GB-SXM"
price_per_hour = "3.43"

[[gpu]]
model = "H100-SXM"
price_per_hour = "6.88"

[[gpu]]
model = "L4"
price_per_hour = "0.805"

[[gpu]]
model = "T4"
price_per_hour = "0.526"

[[gpu]]
model = "V100"
purchase_price = "9000"
lifetime_years = 3
expected_utilisation = "0.6"
power_price_per_kwh = "0.21"
pue = "1.4"

[[instance]]
type = "p4d.24xlarge"
gpu_model = "A100-40GB-SXM"
gpus = 8
price_per_hour = "21.96"
"""


def generate(n_runs: int, seed: int = 1) -> Iterator[tuple[dict, list[dict], list[dict], list[dict]]]:
    """Runs one by one: (run row, label rows, device rows, rollup rows)."""
    rng = random.Random(seed)
    gpus_total = sum(n for _, _, n, _ in NODES) * 8
    mean_gpus = 2.3
    # Mean job length with which n_runs jobs about fill the year (the gaps between jobs and
    # multi-GPU jobs waiting for their last GPU leave about 40 % of the GPU-hours unallocated).
    mean_h = 0.5 * gpus_total * (YEAR1 - YEAR0) / 3600 / (n_runs * mean_gpus)
    nodes = []
    for name, watts, count, instance in NODES:
        for _ in range(count):
            nodes.append((name, watts, instance, [YEAR0 + rng.uniform(0, 3600 * mean_h)] * 8))
    # The node whose earliest GPU frees first takes the next job, so all nodes fill evenly.
    queue = [(min(free), i) for i, (_, _, _, free) in enumerate(nodes)]
    heapq.heapify(queue)
    users = [f"user{i:03d}" for i in range(200)]
    teams = sorted(TEAMS)
    made = 0
    previous: dict[str, str] = {}
    while made < n_runs and queue:
        _, node = heapq.heappop(queue)
        name, watts, instance, free = nodes[node]
        g = rng.choices([1, 2, 4, 8], weights=[50, 20, 15, 15])[0]
        slots = sorted(range(8), key=lambda i: free[i])[:g]
        start = max(free[i] for i in slots) + rng.uniform(0, 0.33 * 3600 * mean_h)
        hours = min(14 * 24.0, rng.expovariate(1 / mean_h))
        end = start + hours * 3600
        for i in slots:
            free[i] = end
        if start >= YEAR1:
            continue  # this node's year is full: it leaves the queue
        heapq.heappush(queue, (min(free), node))
        made += 1
        rid = str(uuidlib.UUID(int=rng.getrandbits(128)))
        team = teams[made % len(teams)]
        project = rng.choice(TEAMS[team])
        user = users[(teams.index(team) * 40 + rng.randrange(40)) % len(users)]  # not hash(): seeded
        status = rng.choices(["succeeded", "killed", "lost", "failed"], weights=[96, 2, 1, 1])[0]
        util = rng.uniform(0.05, 0.98)
        last = end if status == "succeeded" else start + (end - start) * rng.uniform(0.3, 1.0)
        attempt_of = previous.get(project) if rng.random() < 0.01 else None
        previous[project] = rid
        labels = {"team": team, "project": project}
        if instance and rng.random() < 0.8:
            labels["instance_type"] = instance
        run = {
            "id": rid,
            "attempt_of": attempt_of,
            "name": None,
            "status": status,
            "command": '["python","train.py"]',
            "cwd": "/work",
            "user": user,
            "host": f"node{node:03d}",
            "started_at": start,
            "ended_at": None if status == "lost" else end,
            "exit_code": 0 if status == "succeeded" else 1,
            "signal": None,
            "labels": json.dumps(labels),
            "git": "{}",
            "versions": "{}",
            "meta": "{}",
            "replayed": False,
            "interval_s": 5.0,
            "recorder_pid": None,
            "log_path": None,
            "status_reason": None,
            "gpu_note": None,
            "project": project,
            "team": team,
            "rolled_up": True,
        }
        label_rows = [{"run_id": rid, "key": k, "value": v} for k, v in labels.items()]
        devices, rollups = [], []
        for n, slot in enumerate(slots):
            devices.append(
                {"run_id": rid, "uuid": f"GPU-{node:03d}-{slot}-{rid[:8]}", "index": n, "name": name, "source": "nvml"}
            )
        day = math.floor(start / DAY)
        t = start
        while t < last:  # one rollup row per day for the run's g GPUs of one model
            b = min(last, (day + 1) * DAY)
            seconds = (b - t) * g
            rollups.append(
                {
                    "run_id": rid,
                    "day": day,
                    "gpu_name": name,
                    "mig_profile": "",
                    "gpus": g,
                    "t0": t,
                    "t1": b,
                    "alloc_s": seconds,
                    "busy_s": seconds * util,
                    "energy_j": seconds * watts * (0.3 + 0.7 * util),
                    "intervals": g * max(1, int((b - t) // 5)),
                    "share_rule": None,
                    "team": team,
                    "project": project,
                    "user": user,
                    "instance_type": labels.get("instance_type"),
                    "measured": True,
                }
            )
            t, day = b, day + 1
        yield run, label_rows, devices, rollups


RUN_COLS = [
    "id",
    "attempt_of",
    "name",
    "status",
    "command",
    "cwd",
    "user",
    "host",
    "started_at",
    "ended_at",
    "exit_code",
    "signal",
    "labels",
    "git",
    "versions",
    "meta",
    "replayed",
    "interval_s",
    "recorder_pid",
    "log_path",
    "status_reason",
    "gpu_note",
    "project",
    "team",
    "rolled_up",
]
LABEL_COLS = ["run_id", "key", "value"]
DEVICE_COLS = ["run_id", "uuid", "index", "name", "source"]
ROLLUP_COLS = [
    "run_id",
    "day",
    "gpu_name",
    "mig_profile",
    "gpus",
    "t0",
    "t1",
    "alloc_s",
    "busy_s",
    "energy_j",
    "intervals",
    "share_rule",
    "team",
    "project",
    "user",
    "instance_type",
    "measured",
]
TABLES = (("runs", RUN_COLS), ("run_labels", LABEL_COLS), ("devices", DEVICE_COLS), ("gpu_rollups", ROLLUP_COLS))


def load(url: str, n_runs: int, batch: int = 20000) -> dict[str, int]:
    Ledger(url).close()  # create the schema (migrations)
    counts = dict.fromkeys(("runs", "run_labels", "devices", "gpu_rollups"), 0)
    buffers: dict[str, list[dict]] = {t: [] for t, _ in TABLES}
    writer = _sqlite_writer(url) if url.startswith("sqlite") else _pg_writer(url)
    for run, labels, devices, rollups in generate(n_runs):
        buffers["runs"].append(run)
        buffers["run_labels"] += labels
        buffers["devices"] += devices
        buffers["gpu_rollups"] += rollups
        if len(buffers["runs"]) >= batch:
            _flush(writer, buffers, counts)
    _flush(writer, buffers, counts)
    writer(None, None)
    return counts


def _flush(writer, buffers: dict[str, list[dict]], counts: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    for table, cols in TABLES:  # parents first: foreign keys
        rows = buffers[table]
        if rows:
            writer(table, (cols, rows))
            counts[table] += len(rows)
            buffers[table] = []


def _sqlite_writer(url: str):  # type: ignore[no-untyped-def]
    import sqlite3

    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    conn.execute("PRAGMA synchronous = OFF")

    def write(table: str | None, payload) -> None:  # type: ignore[no-untyped-def]
        if table is None:
            conn.execute("ANALYZE")
            conn.commit()
            conn.close()
            return
        cols, rows = payload
        names = ", ".join(f'"{c}"' for c in cols)
        sql = f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(cols))})"
        conn.executemany(sql, [tuple(r.get(c) for c in cols) for r in rows])
        conn.commit()

    return write


def _pg_writer(url: str):  # type: ignore[no-untyped-def]
    import psycopg
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    options = parsed.query.get("options")
    conninfo = parsed.set(drivername="postgresql", query={}).render_as_string(hide_password=False)
    conn = psycopg.connect(conninfo, options=options) if options else psycopg.connect(conninfo)

    def write(table: str | None, payload) -> None:  # type: ignore[no-untyped-def]
        if table is None:
            conn.execute("ANALYZE")
            conn.commit()
            conn.close()
            return
        cols, rows = payload
        with (
            conn.cursor() as cur,
            cur.copy(f"COPY {table} ({', '.join(chr(34) + c + chr(34) for c in cols)}) FROM STDIN") as copy,
        ):
            for r in rows:
                copy.write_row(tuple(r.get(c) for c in cols))
        conn.commit()

    return write


def timed(fn, repeat: int = 3) -> tuple[float, float, object]:  # type: ignore[no-untyped-def]
    """Median wall time and median CPU time of this process (the machines are shared: CPU time
    does not count waiting for a core another process holds; it does not count the database
    server's own CPU either, which for PostgreSQL runs in its backend)."""
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus), result


def bench(url: str, label: str, card) -> list[tuple[str, float, str]]:  # type: ignore[no-untyped-def]
    led = Ledger(url)
    out = []
    month = month_window("2026-06")
    year = window_from_args(None, "2026-01-01", "2026-12-31", 0)
    for what, (lo, hi), by in (
        ("month 2026-06 by team", month, ("team",)),
        ("month 2026-06 by team,project,user,gpu_model", month, ("team", "project", "user", "gpu_model")),
        ("year 2026 by team", year, ("team",)),
        ("year 2026 by team,project,user,gpu_model", year, ("team", "project", "user", "gpu_model")),
    ):
        seconds, cpu, cb = timed(
            lambda lo=lo, hi=hi, by=by: chargeback(led, scope=None, card=card, start=lo, end=hi, by=by)
        )
        total = cb.total  # type: ignore[attr-defined]
        groups = len(cb.groups)  # type: ignore[attr-defined]
        note = f"{total['runs']:,} runs, {total['allocated_gpu_h']:,.0f} GPU-h, {groups:,} groups"
        note += f", cost {total['cost'][:14]}"
        print(f"  {label:10} {what:48} {seconds:6.2f} s wall {cpu:6.2f} s CPU   ({note})", flush=True)
        out.append((what, seconds, note))
    led.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=500_000, help="runs in the simulated year (default 500,000)")
    ap.add_argument("--backends", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    ap.add_argument(
        "--pg-url", default=os.environ.get("GPULEDGER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
    )
    ap.add_argument("--keep", metavar="DIR", help="keep the SQLite file in DIR (and reuse it if it is there)")
    ap.add_argument("--pg-schema", metavar="NAME", help="use (and keep) this PostgreSQL schema; loaded if empty")
    args = ap.parse_args()
    card = parse_rate_card(RATES, "benchmark card")
    print(
        f"chargeback benchmark: {args.runs:,} runs over 2026 on {sum(n for _, _, n, _ in NODES) * 8:,} GPUs", flush=True
    )
    for backend in args.backends.split(","):
        if backend == "sqlite":
            folder = Path(args.keep or tempfile.mkdtemp(prefix="gl-bench-"))
            path = folder / f"year-{args.runs}.db"
            url = f"sqlite:///{path}"
            if not path.exists():
                t = time.perf_counter()
                counts = load(url, args.runs)
                print(
                    f"  sqlite     loaded {counts} in {time.perf_counter() - t:.0f} s "
                    f"({path.stat().st_size / 2**20:,.0f} MiB)",
                    flush=True,
                )
            bench(url, "sqlite", card)
            if not args.keep:
                path.unlink()
        elif backend == "postgres":
            url, drop, fresh = _pg_schema(args.pg_url, args.pg_schema)
            try:
                if fresh:
                    t = time.perf_counter()
                    counts = load(url, args.runs)
                    print(f"  postgres   loaded {counts} in {time.perf_counter() - t:.0f} s", flush=True)
                bench(url, "postgres", card)
            finally:
                if not args.pg_schema:
                    drop()


def _pg_schema(base: str, name: str | None = None):  # type: ignore[no-untyped-def]
    """(URL of a schema to use, a function dropping it, whether it needs loading)."""
    import psycopg
    from sqlalchemy.engine import make_url

    admin = make_url(base).set(drivername="postgresql")
    conninfo = admin.render_as_string(hide_password=False)
    schema = name or f"gl_bench_{uuidlib.uuid4().hex[:10]}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        sql = "SELECT count(*) = 0 FROM information_schema.tables WHERE table_schema = %s AND table_name = 'runs'"
        fresh = conn.execute(sql, (schema,)).fetchone()[0]
        if not fresh:
            fresh = conn.execute(f'SELECT count(*) = 0 FROM "{schema}".runs').fetchone()[0]

    def drop() -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    url = admin.set(drivername="postgresql+psycopg").update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False), drop, fresh


if __name__ == "__main__":
    main()
