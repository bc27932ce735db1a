"""Bytes at rest per capacity interval: the ledger's ``gpu_capacity`` beside the series stores'
capacity tables (docs/SCALE.md, issue 38).

    python benchmarks/capacity_storage.py [--gpus 64] [--hours 24] [--seed 7] [--pg URL]

Telemetry: per GPU (8 to a host), jobs and idle gaps of 3-18 minutes in turn, 10 s agent
intervals (the node agent's default): in a job the GPU is held, busy a normal 70 ± 20 % of each
interval and idle the rest, drawing 250-400 W; between jobs it is unallocated at 55-65 W. Energy in
joules to the mJ, as NVML's counter gives it.

Stores, all holding the same intervals, each filled through gpuledger's own write path:
- ``ledger``: ``gpu_capacity`` of a fresh PostgreSQL ledger (store/capacity.write_capacity; table,
  primary key and host index after VACUUM; the day sums ``gpu_capacity_days`` not counted);
- ``pg-compact``: the compact PostgreSQL store's ``cap_iv`` day partitions (series/postgres.py
  ``write_capacity``), as written and after ``maintain()`` rebuilt the closed days' key indexes;
- ``clickhouse``: ``capacity_intervals`` on chDB (series/clickhouse.py), active parts after
  OPTIMIZE FINAL. The rows it returns are checked against what went in.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
import uuid
from typing import Any

import psycopg

from gpuledger.series import capacity
from gpuledger.series.open import open_series
from gpuledger.store import Ledger
from gpuledger.store.capacity import interval_from_row, write_capacity

STEP_MS = 10_000
BATCH = 5000  # the agent's batch (agent/capacity_push.BATCH_ROWS)
_PARTS = (
    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_inherits i JOIN pg_class c "
    "ON c.oid = i.inhrelid WHERE i.inhparent = 'series.cap_iv'::regclass"
)


def telemetry(gpus: int, hours: int, seed: int) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    day0 = (int(time.time() // 86400) - 2) * 86_400_000
    rows = []
    for g in range(gpus):
        gpu, host = f"GPU-{uuid.UUID(int=rnd.getrandbits(128))}", f"node-{g // 8:04d}"
        t, job = day0, False
        while t < day0 + hours * 3_600_000:
            job = not job
            for _ in range(rnd.randint(3, 18) * 6):
                if job:
                    busy = max(0, min(STEP_MS, int(rnd.gauss(7000, 2000))))
                    states, watts = (0, STEP_MS - busy, busy, 0), rnd.uniform(250, 400)
                else:
                    states, watts = (STEP_MS, 0, 0, 0), rnd.uniform(55, 65)
                rows.append({
                    "gpu_uuid": gpu, "host": host, "t0_ms": t, "t1_ms": t + STEP_MS,
                    **dict(zip(capacity.STATES[:4], states, strict=True)), "unmeasured_ms": 0,
                    "energy_j": round(watts * STEP_MS / 1000, 3),
                })  # fmt: skip
                t += STEP_MS
    return rows


def _show(name: str, size: int, n: int) -> None:
    print(f"{name:<28} {size:>14,} B  {size / n:8.2f} B/interval")


def on_postgres(pg: str, rows: list[dict[str, Any]]) -> None:
    name = f"capacity_bytes_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = pg.rsplit("/", 1)[0] + f"/{name}"
    try:
        with Ledger(url, migrate=True) as led:
            ivs = [interval_from_row(r) for r in rows]
            for i in range(0, len(ivs), BATCH):
                led.write(lambda conn, part=ivs[i : i + BATCH]: write_capacity(led.database, conn, part))
        store = open_series(url + "?schema=series")
        store.create()
        for i in range(0, len(rows), BATCH):
            store.write_capacity(rows[i : i + BATCH], capacity.token(rows[i : i + BATCH]))
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE gpu_capacity")
            conn.execute("VACUUM ANALYZE series.cap_iv")
            _show("ledger gpu_capacity", conn.execute("SELECT pg_total_relation_size('gpu_capacity')").fetchone()[0],
                  len(rows))  # fmt: skip
            _show("pg-compact cap_iv", conn.execute(_PARTS).fetchone()[0], len(rows))
            store.maintain()  # type: ignore[attr-defined]
            _show("pg-compact cap_iv, closed", conn.execute(_PARTS).fetchone()[0], len(rows))
        store.close()
    finally:
        with psycopg.connect(pg, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def on_clickhouse(rows: list[dict[str, Any]]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        store = open_series(f"chdb://{folder}/series", raw_days=30)
        store.create()
        for i in range(0, len(rows), BATCH):
            store.write_capacity(rows[i : i + BATCH], capacity.token(rows[i : i + BATCH]))
        client = store.client  # type: ignore[attr-defined]
        client.command("OPTIMIZE TABLE gpuledger.capacity_intervals FINAL")
        size = client.query(
            "SELECT sum(bytes_on_disk) FROM system.parts WHERE database = 'gpuledger' "
            "AND table = 'capacity_intervals' AND active"
        )[0][0]
        _show("clickhouse capacity_intervals", int(size), len(rows))
        gpus = sorted({r["gpu_uuid"] for r in rows})
        back = store.capacity_intervals(gpus, 0, max(r["t1_ms"] for r in rows))
        want = sorted((capacity.quantize(r) for r in rows), key=lambda r: (r["gpu_uuid"], r["t0_ms"]))
        assert back == want, "the store did not return what went in"
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--hours", type=int, default=24)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test", help="a database to create one in")
    args = ap.parse_args()
    rows = telemetry(args.gpus, args.hours, args.seed)
    print(f"{len(rows):,} capacity intervals ({args.gpus} GPUs x {args.hours} h at 10 s)")
    on_postgres(args.pg, rows)
    on_clickhouse(rows)


if __name__ == "__main__":
    main()
