"""What sealing the capacity ledger costs a team ledger on PostgreSQL (store/capacity_audit.py).

    python benchmarks/capacity_seal.py [--gpus 1024] [--days 365] [--keep] [--pg URL]

Builds, in a fresh schema, a team ledger (one audit row from the real accounts code, so it keeps a
trail) whose ``gpu_capacity_days`` holds ``--gpus`` GPUs (8 per host) for ``--days`` UTC days, one
row per GPU and day (bulk insert: what a year of agent pushes leaves, without the raw intervals).
Then, timed, with the real code:

- **catch-up**: the capacity writes that seal it from nothing, a week per write (what an upgraded
  ledger's next writes do), each an empty ``write_capacity`` in a transaction of its own;
- **a day's seal**: the one write a day that seals the day before yesterday, after a day's rows are
  added (every other write of the day takes the fast path: one indexed query, no lock);
- **a write that takes the fast path**: the extra cost of every ordinary capacity write;
- ``audit.verify`` of the whole ledger: the capacity check (every sealed GPU-day recomputed and
  compared with its seal, a day at a time) and the rest, and the process's peak RSS growth.

There is no peer: no other GPU accounting tool seals its capacity figures. Building is not timed.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import psycopg
import sqlalchemy as sa
from _common import machine_line, source_state

from gpuledger.core.capacity.model import DAY_MS
from gpuledger.store import Ledger, accounts, audit, schema
from gpuledger.store.capacity import write_capacity

PG = os.environ.get("GPULEDGER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
FIRST_DAY = 20_000  # 2024-10-04


def _url(base: str, name: str) -> str:
    return base.replace("postgresql://", "postgresql+psycopg://", 1) + f"?options=-csearch_path%3D{name}"


def _day_rows(gpus: int, day: int) -> list[dict]:
    busy = 6 * 3_600_000
    return [
        {"gpu_uuid": f"GPU-{g:05d}", "day": day, "host": f"node-{g // 8:04d}", "first_ms": day * DAY_MS,
         "last_ms": (day + 1) * DAY_MS, "unallocated_ms": DAY_MS - 2 * busy - g, "alloc_idle_ms": busy,
         "busy_attr_ms": busy + g, "busy_unattr_ms": 0, "unmeasured_ms": 0, "energy_j": 2.5e7 + g, "intervals": 8640}
        for g in range(gpus)
    ]  # fmt: skip


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--days", type=int, default=365)
    ap.add_argument("--pg", default=PG, help="PostgreSQL server URL (a schema is made and dropped)")
    ap.add_argument("--keep", action="store_true", help="keep the schema")
    args = ap.parse_args()
    print(f"# {machine_line()}\n# {source_state()}")
    name = f"gl_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(args.pg, autocommit=True) as c:
        c.execute(f'CREATE SCHEMA "{name}"')
    try:
        with Ledger(_url(args.pg, name)) as led:
            accounts.add_project(led, "fleet", actor="admin")  # a team ledger: it keeps an audit trail
            t0 = time.perf_counter()
            for day in range(FIRST_DAY, FIRST_DAY + args.days):
                led.write(lambda c, d=day: c.execute(sa.insert(schema.gpu_capacity_days), _day_rows(args.gpus, d)))
            print(f"built {args.gpus} GPUs x {args.days} days = {args.gpus * args.days:,} GPU-days in "
                  f"{time.perf_counter() - t0:.0f} s (not timed)")  # fmt: skip
            db = led.database
            today = FIRST_DAY + args.days + 1  # every day built is due, the next one not yet
            seal_at = today * 86_400 + 43_200

            def write(now: float) -> float:
                t = time.perf_counter()
                led.write(lambda c: write_capacity(db, c, [], now=now))
                return time.perf_counter() - t

            writes, t0 = 0, time.perf_counter()
            while writes < args.days:  # a week per write until nothing is due
                before = led.read(lambda c: c.scalar(sa.select(sa.func.count()).select_from(schema.audit_log)))
                write(seal_at)
                writes += 1
                if led.read(lambda c: c.scalar(sa.select(sa.func.count()).select_from(schema.audit_log))) == before:
                    break
            catch_up = time.perf_counter() - t0
            print(f"catch-up: {writes - 1} sealing writes, {catch_up:.1f} s in all, "
                  f"{catch_up / max(1, writes - 1) * 1000:.0f} ms each (a week of {args.gpus} GPUs)")  # fmt: skip
            new_day = FIRST_DAY + args.days
            led.write(lambda c: c.execute(sa.insert(schema.gpu_capacity_days), _day_rows(args.gpus, new_day)))
            one_day = write((new_day + 2) * 86_400 + 3600)
            fast = min(write((new_day + 2) * 86_400 + 7200) for _ in range(20))
            print(f"a day's seal ({args.gpus} GPU-days): {one_day * 1000:.0f} ms; "
                  f"a write on the fast path: {fast * 1000:.2f} ms (best of 20, the whole empty write)")  # fmt: skip
            rss0 = _rss_mib()
            t0 = time.perf_counter()
            result = audit.verify(led)
            took = time.perf_counter() - t0
            assert result.ok, result.problems[:5]
            checked, through = result.capacity_days_checked, result.capacity_sealed_through
            print(f"verify: {took:.1f} s, OK, {checked:,} capacity GPU-days checked (sealed through {through}); "
                  f"peak RSS +{_rss_mib() - rss0:.0f} MiB")  # fmt: skip
    finally:
        if not args.keep:
            with psycopg.connect(args.pg, autocommit=True) as c:
                c.execute(f'DROP SCHEMA "{name}" CASCADE')


if __name__ == "__main__":
    main()
