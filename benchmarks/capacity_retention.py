"""One capacity retention pass on PostgreSQL: the DELETE per host (a plain ``gpu_capacity``, as
before migration 21) beside dropping whole day partitions (store/capacity_days_drop.py).

    python benchmarks/capacity_retention.py [--gpus 16] [--hours 72] [--rounds 3] [--pg URL]

Each round and mode fills a fresh ledger (a schema of its own) with the telemetry of
benchmarks/capacity_storage.py through store/capacity.write_capacity, then times one pass that
takes every day before the last one (the partitions made ahead, as the server does, so no row
sits in the default partition), and gives the table's bytes (heap, indexes, TOAST, every
partition) before the pass, right after it (no VACUUM: what the next pass and autovacuum find) and
after the VACUUM a DELETE leaves to autovacuum, timed. The same rows go in both modes (the pass's
own count is checked against them).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

import psycopg
import sqlalchemy as sa
from capacity_storage import telemetry

from gpuledger.core.capacity.model import DAY_MS
from gpuledger.store import Ledger, capacity_days_drop, partitions, schema
from gpuledger.store.capacity import interval_from_row, write_capacity
from gpuledger.store.capacity_retention import prune_capacity

_SIZE = (  # a plain table, or every partition of a partitioned one
    "SELECT greatest(pg_total_relation_size('gpu_capacity'), "
    "(SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree('gpu_capacity')))"
)


def _plain(conn: sa.Connection) -> None:
    """``gpu_capacity`` as a plain table (the layout before migration 21), empty."""
    conn.exec_driver_sql("DROP TABLE gpu_capacity")
    schema.gpu_capacity.to_metadata(sa.MetaData()).create(conn)


def one(pg: str, rows: list[dict[str, Any]], mode: str, cut_ms: int) -> tuple[float, int, int, int, float, int]:
    """(seconds, bytes before, bytes after, rows dropped, VACUUM seconds, bytes after VACUUM) of one
    pass in a fresh ledger."""
    name = f"bench_cr_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {name}")
    url = f"{pg.replace('postgresql://', 'postgresql+psycopg://')}?options=-csearch_path%3D{name}"
    try:
        with Ledger(url) as led:
            if mode == "delete":
                led.write(_plain)
            else:  # the days' partitions, made ahead as the server's hourly pass did back then
                partitions.maintain(led.database, now=min(r["t0_ms"] for r in rows) / 1000)
            ivs = [interval_from_row(r) for r in rows]
            for i in range(0, len(ivs), 5000):
                led.write(lambda c, b=ivs[i : i + 5000]: write_capacity(led.database, c, b))  # type: ignore[misc]
            led.write(lambda c: c.exec_driver_sql("ANALYZE gpu_capacity"))
            size = lambda: int(led.read(lambda c: c.exec_driver_sql(_SIZE).scalar()))  # noqa: E731
            before = size()
            t = time.perf_counter()
            if mode == "delete":
                done = prune_capacity(led, cut_ms, actor="bench")
            else:
                done = capacity_days_drop.drop_days(led, cut_ms, actor="bench", now=time.time())
            took = time.perf_counter() - t
            after = size()
            with psycopg.connect(pg, autocommit=True, options=f"-csearch_path={name}") as c:
                t = time.perf_counter()
                c.execute("VACUUM gpu_capacity")  # what the DELETE left for autovacuum; a drop leaves nothing
                vacuum_s = time.perf_counter() - t
            return took, before, after, done.rows, vacuum_s, size()
    finally:
        with psycopg.connect(pg, autocommit=True) as c:
            c.execute(f"DROP SCHEMA {name} CASCADE")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--hours", type=int, default=72)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test", help="a database to create them in")
    a = ap.parse_args()
    rows = telemetry(a.gpus, a.hours, a.seed)
    last_day = max(r["t0_ms"] for r in rows) // DAY_MS
    cut_ms = last_day * DAY_MS  # every day before the last one goes (its intervals all end by then)
    expect = sum(1 for r in rows if r["t1_ms"] <= cut_ms)
    print(f"{len(rows)} intervals, {a.gpus} GPUs, {a.hours} h; a pass takes {expect} of them")
    for mode in ("delete", "drop-days"):
        runs = [one(a.pg, rows, mode, cut_ms) for _ in range(a.rounds)]
        assert all(r[3] == expect for r in runs), (mode, [r[3] for r in runs])
        secs, vac = sorted(r[0] for r in runs), sorted(r[4] for r in runs)
        print(
            f"{mode:>9}: pass {secs[0]:.2f} / {statistics.median(secs):.2f} / {secs[-1]:.2f} s, "
            f"VACUUM after it {vac[0]:.2f} / {statistics.median(vac):.2f} / {vac[-1]:.2f} s (min/median/max); "
            f"gpu_capacity {runs[0][1] / 2**20:.1f} MiB before -> {runs[0][2] / 2**20:.1f} MiB after the pass, "
            f"{runs[0][5] / 2**20:.1f} MiB after VACUUM"
        )


if __name__ == "__main__":
    main()
