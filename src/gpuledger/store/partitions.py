"""PostgreSQL: the raw interval tables partitioned by UTC day, so retention drops days, never rows.

The node agents' capacity intervals (``gpu_capacity``) are partitioned the same way by ``t0_ms``
(milliseconds: ``SPECS`` gives each table's column and unit), since migration 21; retention drops
their days too (store/capacity_days_drop.py).

``gpu_intervals`` and ``host_intervals`` are ``PARTITION BY RANGE (t0)`` (seconds since the epoch),
one partition per UTC day named ``<table>_p<YYYYMMDD>``, plus ``<table>_default``, which catches a
row no day partition takes (an insert never fails: a replay of a long-gone day, a clock far off).
The primary key holds the partition key, as PostgreSQL requires: (run_id, device_uuid, seq, t0)
and (run_id, seq, t0). A retransmitted interval carries the same t0 as the first copy, so it still
conflicts with it and ``ON CONFLICT DO NOTHING`` (and the bulk ingest's own filter) drop it.

``maintain`` creates the partitions ahead and moves strays out of the default partition into their
day (serve runs it at start and every ``partition_every_s``; retention runs it first). A write of
rows for a day with no partition (a replay, an outbox sent days late) makes that day first
(``ensure_days``, store/partition_days.py), so the default partition stays empty: it is kept for a
row that comes some other way (an older gpuledger, plain SQL) and for an older ledger's strays.
SQLite ledgers keep one plain table each: nothing here runs there.
"""

from __future__ import annotations

import calendar
import math
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store.engine import Database

DAY_S = 86400
# Table -> its primary key on PostgreSQL (the partition key t0 last).
KEYS: dict[str, tuple[str, ...]] = {
    "gpu_intervals": ("run_id", "device_uuid", "seq", "t0"),
    "host_intervals": ("run_id", "seq", "t0"),
}


@dataclass(frozen=True)
class Spec:
    """How a table is partitioned: its key, the start column and its units per second, and what
    the rewrite re-creates after the copy (the runs foreign key, secondary indexes: name, columns)."""

    key: tuple[str, ...]
    column: str = "t0"
    per_s: int = 1
    run_fk: bool = True
    indexes: tuple[tuple[str, str], ...] = ()

    def day_of(self) -> str:
        """SQL: the UTC day of a row's start."""
        return f"floor({self.column} / {DAY_S * self.per_s})"

    def bounds(self, day: int) -> tuple[int, int]:
        return day * DAY_S * self.per_s, (day + 1) * DAY_S * self.per_s


CAPACITY = "gpu_capacity"
SPECS: dict[str, Spec] = {
    **{table: Spec(key) for table, key in KEYS.items()},
    CAPACITY: Spec(
        ("gpu_uuid", "t0_ms"), "t0_ms", 1000, run_fk=False, indexes=(("ix_gpu_capacity_host_t0", "host, t0_ms"),)
    ),
}
# rollup_marks.level_s of a run's device whose raw rows went with their day (store/retention_days.py);
# such a run's cost rollups are final (store/rollup_stale.py).
DROPPED_LEVEL = 86400
AHEAD_DAYS = 2  # partitions created for today and this many days ahead
_LOCK_TIMEOUT = "10s"  # DDL waits at most this for ingest transactions, then fails (retried later)
_LOCK_KEY = 0x67707501  # first key of the maintainers' advisory lock (migrations take ...00)


@dataclass
class Maintained:
    created: list[str] = field(default_factory=list)
    moved: int = 0  # rows moved out of the default partitions


def day_name(table: str, day: int) -> str:
    return f"{table}_p{time.strftime('%Y%m%d', time.gmtime(day * DAY_S))}"


def default_name(table: str) -> str:
    return f"{table}_default"


def is_partitioned(conn: Connection, table: str) -> bool:
    q = "SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass(:t)"
    return conn.execute(sa.text(q), {"t": table}).first() is not None


def day_partitions(conn: Connection, table: str) -> dict[int, str]:
    """Day (days since 1970-01-01 UTC) -> partition name, of ``table``'s day partitions."""
    q = "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(:t)"
    prefix = f"{table}_p"
    out: dict[int, str] = {}
    for (name,) in conn.execute(sa.text(q), {"t": table}):
        if name.startswith(prefix):
            out[calendar.timegm(time.strptime(name[len(prefix) :], "%Y%m%d")) // DAY_S] = name
    return out


def partition_tables(conn: Connection, tables: tuple[str, ...] = tuple(KEYS)) -> None:
    """Make both raw tables partitioned by day, keeping every row (migration 18, and a fresh
    PostgreSQL ledger). Skipped on SQLite and for a table already partitioned. An existing table is
    rewritten once: a partitioned twin is created with a partition per day holding rows, the rows
    copied (INSERT ... SELECT), the names swapped and the old table dropped; it needs the table's
    size again in free disk while it runs and holds an exclusive lock on the table throughout."""
    if conn.dialect.name != "postgresql":
        return
    for table in tables:
        if not is_partitioned(conn, table):
            _partition(conn, table, SPECS[table])


def partition_capacity(conn: Connection) -> None:
    """``gpu_capacity`` partitioned by UTC day of ``t0_ms``, every row kept (migration 21, and a
    fresh PostgreSQL ledger); as ``partition_tables`` does it."""
    partition_tables(conn, (CAPACITY,))


def _partition(conn: Connection, table: str, spec: Spec) -> None:
    old = f"{table}_unpartitioned"
    x = conn.exec_driver_sql
    x(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    pk = conn.execute(
        sa.text("SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(:t) AND contype = 'p'"), {"t": table}
    ).scalar()
    x(f"ALTER TABLE {table} RENAME TO {old}")
    if pk:  # the constraint's index is a relation: its name must be free for the new table's
        x(f'ALTER TABLE {old} RENAME CONSTRAINT "{pk}" TO {old}_pkey')
    x(f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS) PARTITION BY RANGE ({spec.column})")
    x(f"CREATE TABLE {default_name(table)} PARTITION OF {table} DEFAULT")
    days = [int(d) for (d,) in conn.exec_driver_sql(f"SELECT DISTINCT {spec.day_of()} FROM {old}")]
    for day in sorted(days):
        _create_day(conn, table, day)
    columns = ", ".join(f'"{c}"' for c in _columns(conn, old))
    x(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {old}")
    # The key and the foreign key after the copy: one index build per partition, not row by row.
    x(f"ALTER TABLE {table} ADD CONSTRAINT {table}_pkey PRIMARY KEY ({', '.join(spec.key)})")
    if spec.run_fk:
        fk = f"{table}_run_id_fkey FOREIGN KEY (run_id) REFERENCES runs (id) ON DELETE CASCADE"
        x(f"ALTER TABLE {table} ADD CONSTRAINT {fk}")
    x(f"DROP TABLE {old}")  # its indexes with it: their names are free for the new table's
    for name, columns in spec.indexes:
        x(f"CREATE INDEX {name} ON {table} ({columns})")


def _columns(conn: Connection, table: str) -> list[str]:
    q = (
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(:t) AND attnum > 0 AND NOT attisdropped "
        "ORDER BY attnum"
    )
    return list(conn.execute(sa.text(q), {"t": table}).scalars())


def _create_day(conn: Connection, table: str, day: int) -> str:
    name = day_name(table, day)
    lo, hi = SPECS[table].bounds(day)
    conn.exec_driver_sql(f"CREATE TABLE {name} PARTITION OF {table} FOR VALUES FROM ({lo}) TO ({hi})")
    return name


def ensure_partitions(conn: Connection, t_from: float, t_to: float) -> Maintained:
    """The day partitions of the partitioned tables (SPECS) covering [t_from, t_to] and every day a stray row in a
    default partition belongs to, created where missing; the strays moved into them. Serialised
    between server replicas by an advisory lock; ingest is not held up (see _attach_day)."""
    wanted = set(range(math.floor(t_from / DAY_S), math.floor(t_to / DAY_S) + 1))
    return _ensure(conn, dict.fromkeys(SPECS, wanted), every_stray=True)


def ensure_days(conn: Connection, days: Mapping[str, Collection[int]]) -> Maintained:
    """The day partitions of ``days`` (table -> days since 1970-01-01 UTC) created where missing, for
    rows about to be written (store/partition_days.py), under the same lock and rules as
    ``ensure_partitions``: a writer racing another to make the same day waits for it and finds the
    day made. Only strays of those days are moved (an older ledger's); the others wait for the
    hourly pass, so a late row does not hold its write up for them."""
    return _ensure(conn, days, every_stray=False)


def _ensure(conn: Connection, days: Mapping[str, Collection[int]], every_stray: bool) -> Maintained:
    out = Maintained()
    if conn.dialect.name != "postgresql":
        return out
    conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT}'")
    conn.execute(
        sa.text("SELECT pg_advisory_xact_lock(:k, hashtext(coalesce(current_schema(), '')))"), {"k": _LOCK_KEY}
    )
    for table, spec in SPECS.items():  # this order, parent before partitions: as every maintainer locks
        wanted = set(days.get(table, ()))
        if not (wanted or every_stray) or not is_partitioned(conn, table):
            continue
        if not every_stray and wanted <= set(day_partitions(conn, table)):
            continue  # another writer made them while this one waited for the lock: nothing to hold
        default = default_name(table)
        days_of = f"SELECT DISTINCT {spec.day_of()} FROM {default}"
        if not every_stray:  # only these days' strays: no scan of all an older ledger left there
            lo, hi = spec.bounds(min(wanted))[0], spec.bounds(max(wanted))[1]
            days_of += f" WHERE {spec.column} >= {lo} AND {spec.column} < {hi}"
        only = None if every_stray else wanted
        if _strays(conn, days_of, only) - set(day_partitions(conn, table)):
            # Rows will move: no statement may be planned against the old partitions and run after
            # the move (it would read the default partition without them and miss the new one), so
            # the whole table is held for the move. Taken first, parent before partitions, as every
            # writer takes them: no deadlock with ingest. Rare: rows an older ledger left there
            # (writes make their day first now, store/partition_days.py), or a day it failed to make.
            conn.exec_driver_sql(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        else:
            # No row may reach the default partition between the attach and its check of it.
            conn.exec_driver_sql(f"LOCK TABLE {default} IN EXCLUSIVE MODE")
        moving = _strays(conn, days_of, only)  # held now: no row can join them
        for day in sorted((wanted | moving) - set(day_partitions(conn, table))):
            out.moved += _attach_day(conn, table, day, move=day in moving)
            out.created.append(day_name(table, day))
    return out


def _strays(conn: Connection, days_of: str, only: set[int] | None) -> set[int]:
    """The days of the rows in a default partition (``days_of`` reads them), of ``only`` those."""
    found = {int(d) for (d,) in conn.exec_driver_sql(days_of)}
    return found if only is None else found & only


def _attach_day(conn: Connection, table: str, day: int, *, move: bool) -> int:
    """A day partition, holding the day's rows moved out of the default partition (``move``: the
    caller found some there, under its lock); their count.
    ``CREATE TABLE ... PARTITION OF`` would lock the whole table against ingest and refuses a day
    whose rows sit in the default partition, so the day's table is made and filled on its own and
    attached after (PostgreSQL then locks only the default partition, and its check finds none of
    the day's rows there; the CHECK spares it a scan of the new one).
    The move is a DELETE ... INSERT (dead rows in the default partition, until vacuum): writes make
    their day before they write (store/partition_days.py), so it runs only for rows already there,
    which an older ledger (or a day that could not be made in time) left, and which no DDL can
    move any other way."""
    name, default = day_name(table, day), default_name(table)
    col = SPECS[table].column
    lo, hi = SPECS[table].bounds(day)
    x = conn.exec_driver_sql
    x(f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS)")
    x(f"ALTER TABLE {name} ADD CONSTRAINT {name}_bound CHECK ({col} >= {lo} AND {col} < {hi})")
    moved = 0
    if move:
        moved = x(f"WITH gone AS (DELETE FROM {default} WHERE {col} >= {lo} AND {col} < {hi} RETURNING *) "
                  f"INSERT INTO {name} SELECT * FROM gone").rowcount  # fmt: skip
    x(f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES FROM ({lo}) TO ({hi})")
    x(f"ALTER TABLE {name} DROP CONSTRAINT {name}_bound")
    return int(moved)


def maintain(db: Database, now: float | None = None, ahead_days: int = AHEAD_DAYS) -> Maintained:
    """``ensure_partitions`` from yesterday to ``ahead_days`` ahead, in one write transaction."""
    if db.dialect != "postgresql":
        return Maintained()
    now = time.time() if now is None else now
    return db.write(lambda conn: ensure_partitions(conn, now - DAY_S, now + ahead_days * DAY_S))
