"""Late capacity on PostgreSQL: rows for days with no partition, written as before (into the default
partition, moved out by the hourly pass with DELETE ... INSERT) beside made first (store/partition_days.py).

    python benchmarks/late_days.py [--gpus 16] [--hours 24] [--days-late 10] [--rounds 3] [--pg URL]

Each round and mode fills a fresh ledger (a schema of its own) with the telemetry of
benchmarks/capacity_storage.py shifted ``--days-late`` days back, through store/capacity.write_capacity
in batches of 5,000, timed; then times the hourly pass (``partitions.maintain``) and gives the bytes of
the default partition after it (what the move left for vacuum). "before" makes the write route as the
code before did: this process is told the days have partitions, so the rows go to the default one.
Also the check's cost in the common case: ``require`` on a 5,000-row batch whose day is known.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
from capacity_storage import telemetry

from gpuledger.core.capacity.model import DAY_MS
from gpuledger.store import Ledger, partition_days, partitions
from gpuledger.store.capacity import interval_from_row, write_capacity

_DEFAULT_SIZE = "SELECT pg_total_relation_size('gpu_capacity_default')"
_BATCH = 5000


@contextlib.contextmanager
def _fresh_ledger(pg: str) -> Iterator[Ledger]:
    """A ledger in a schema of its own, its days made ahead as the server does at start; dropped after."""
    name = f"bench_ld_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {name}")
    url = f"{pg.replace('postgresql://', 'postgresql+psycopg://')}?options=-csearch_path%3D{name}"
    try:
        with Ledger(url) as led:
            partitions.maintain(led.database)
            yield led
    finally:
        with psycopg.connect(pg, autocommit=True) as c:
            c.execute(f"DROP SCHEMA {name} CASCADE")


def one(pg: str, rows: list[dict[str, Any]], mode: str) -> tuple[float, float, int, int]:
    """(write seconds, hourly pass seconds, rows it moved, default partition bytes after it)."""
    with _fresh_ledger(pg) as led:
        if mode == "before":
            days = partition_days.days_of("gpu_capacity", [r["t0_ms"] for r in rows])
            partition_days._catalog(led.database).settle("gpu_capacity", days)
        ivs = [interval_from_row(r) for r in rows]
        t = time.perf_counter()
        for i in range(0, len(ivs), _BATCH):
            led.write(lambda c, b=ivs[i : i + _BATCH]: write_capacity(led.database, c, b))  # type: ignore[misc]
        wrote = time.perf_counter() - t
        t = time.perf_counter()
        done = partitions.maintain(led.database)
        passed = time.perf_counter() - t
        size = int(led.read(lambda c: c.exec_driver_sql(_DEFAULT_SIZE).scalar()))
        return wrote, passed, done.moved, size


def check_cost(pg: str, rounds: int) -> list[float]:
    """µs of one ``require`` of a 5,000-row batch on a known day (the common case), per round."""
    with _fresh_ledger(pg) as led:
        now_ms = int(time.time() * 1000)
        starts = {"gpu_capacity": [now_ms - 10_000 * k for k in range(_BATCH)]}
        db = led.database
        out = []
        n = 200
        for _ in range(rounds):
            took = led.read(lambda c: _timed(lambda: [partition_days.require(db, c, starts) for _ in range(n)]))
            out.append(took / n * 1e6)
        return out


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _mmm(xs: list[float], fmt: str) -> str:
    xs = sorted(xs)
    return f"{xs[0]:{fmt}} / {statistics.median(xs):{fmt}} / {xs[-1]:{fmt}}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--hours", type=int, default=24)
    ap.add_argument("--days-late", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test", help="a database to create them in")
    a = ap.parse_args()
    rows = telemetry(a.gpus, a.hours, a.seed)
    first_day = min(r["t0_ms"] for r in rows) // DAY_MS
    shift = (int(time.time() * 1000) // DAY_MS - a.days_late - first_day) * DAY_MS
    rows = [{**r, "t0_ms": r["t0_ms"] + shift, "t1_ms": r["t1_ms"] + shift} for r in rows]
    print(f"{len(rows)} intervals, {a.gpus} GPUs, {a.hours} h, {a.days_late} days late; min / median / max")
    for mode in ("before", "made-first"):
        runs = [one(a.pg, rows, mode) for _ in range(a.rounds)]
        print(
            f"{mode:>10}: write {_mmm([r[0] for r in runs], '.2f')} s, hourly pass "
            f"{_mmm([r[1] for r in runs], '.3f')} s moving {runs[0][2]} rows, default partition "
            f"{runs[0][3] / 2**20:.1f} MiB after it (dead rows until vacuum)"
        )
    print(f"require, a {_BATCH}-row batch on a known day: {_mmm(check_cost(a.pg, a.rounds), '.0f')} µs")


if __name__ == "__main__":
    main()
