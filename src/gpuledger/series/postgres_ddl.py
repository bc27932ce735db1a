"""The compact PostgreSQL series store's tables (docs/SCALE.md, "Compact PostgreSQL"), in a schema
of their own:

- ``gpu_keys`` (GPU UUID -> int4), ``run_keys`` (run id -> int4) and ``streams`` ((run, GPU) ->
  int4, with the stream's ``mem_reserved_b``, a per-device constant): a row carries one 4-byte
  stream key instead of two 36-40 character strings;
- ``shapes``: the int2 codes of what repeats between rows (series/postgres_codec.py);
- ``batches``: the tokens of the batches stored, so a resent batch stores nothing; ``kept_from``:
  the first day not dropped, so a batch resent after its day was dropped stores nothing either;
- ``host_keys`` (host name -> int4), for capacity rows;
- ``gpu_iv``, ``host_iv`` and ``cap_iv`` (capacity intervals): ``PARTITION BY RANGE (day)``, one
  partition per UTC day named as the ledger's (store/partitions.day_name), each with its unique
  key (stream, seq) -- the ledger's own identity of an interval, (run, device, seq); (gpu, t_ms)
  for capacity, the ledger's (GPU, start)
  -- and for GPU and host rows a partial index of their *odd* rows (crossing a midnight, or with
  values in ``extra``), the few that the day sums and time windows read one by one.

The unique key is per partition, not on the parent: on the parent PostgreSQL would require the
partition key in it, 2 bytes more per index entry. A resent interval has the same t0, so the same
day, so its partition's key catches it.
"""

from __future__ import annotations

import contextlib
import logging
import re

import psycopg

from gpuledger.series.postgres_codec import DAY_MS, GPU_COLUMNS, GPU_NOT_NULL, HOST_COLUMNS, HOST_NOT_NULL
from gpuledger.store.partitions import day_name

COMPACT_WAIT_S = 60.0  # the longest an index rebuild waits for older transactions (compact_before)
_DROP_WAIT_MS = 2000  # the longest a half-built index's drop waits for the day's table
_log = logging.getLogger(__name__)
_LOCK_KEY = 0x67707502  # first key of this store's advisory lock (store/partitions.py takes ...01)
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,40}")
# Capacity intervals (series/capacity.py): per GPU and agent interval, its states in ms, NULL when 0
# (most intervals spend all their time in one or two of the five), the energy in mJ (NULL: not
# measured). The int8 first and int2 last: no alignment padding. Keyed as the ledger's
# gpu_capacity, (GPU, start): within a day partition (gpu, t_ms).
CAP_STATES = ("unallocated_ms", "alloc_idle_ms", "busy_attr_ms", "busy_unattr_ms", "unmeasured_ms")
CAP_COLUMNS: tuple[tuple[str, str], ...] = (
    ("energy_mj", "int8"),
    ("gpu", "int4"),
    ("host", "int4"),
    ("t_ms", "int4"),
    ("dur_ms", "int4"),
    *((c, "int4") for c in CAP_STATES),
    ("day", "int2"),
)
CAP_NOT_NULL = ("gpu", "host", "t_ms", "dur_ms", "day")
TABLES = {
    "gpu_iv": (GPU_COLUMNS, GPU_NOT_NULL),
    "host_iv": (HOST_COLUMNS, HOST_NOT_NULL),
    "cap_iv": (CAP_COLUMNS, CAP_NOT_NULL),
}
ODD = f"extra IS NOT NULL OR dur_ms > {DAY_MS} - t_ms"  # the GPU rows the day sums read one by one
HOST_ODD = f"dur_ms > {DAY_MS} - t_ms"  # host rows crossing a midnight: a time window's read reaches back for them
KEY_COLUMNS = {"gpu_iv": "stream, seq", "host_iv": "run, seq", "cap_iv": "gpu, t_ms"}
# The partial index of each day's odd rows; capacity is read whole days at a time, by key, and needs none.
ODD_INDEX = {"gpu_iv": f"(stream) WHERE {ODD}", "host_iv": f"(run) WHERE {HOST_ODD}"}


def check_schema(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"series schema {name!r}: use lower-case letters, digits and _ (at most 41)")
    return name


def _lock(conn: psycopg.Connection, schema: str) -> None:
    """Serialise DDL of this schema between server processes, until the transaction ends."""
    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_LOCK_KEY, schema))


def _columns(columns: tuple[tuple[str, str], ...], not_null: tuple[str, ...]) -> str:
    return ", ".join(f"{c} {t}{' NOT NULL' if c in not_null else ''}" for c, t in columns)


def create(conn: psycopg.Connection, schema: str) -> None:
    """Create what is missing; safe on every start and from several servers at once."""
    s = check_schema(schema)
    with conn.transaction():
        _lock(conn, s)
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
        ident = "int4 GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
        conn.execute(f"CREATE TABLE IF NOT EXISTS {s}.gpu_keys (key {ident}, uuid text NOT NULL UNIQUE)")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {s}.run_keys (key {ident}, run_id text NOT NULL UNIQUE)")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {s}.host_keys (key {ident}, host text NOT NULL UNIQUE)")
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {s}.streams (key {ident}, run int4 NOT NULL REFERENCES {s}.run_keys, "
            f"gpu int4 NOT NULL REFERENCES {s}.gpu_keys, mem_reserved_b int8, UNIQUE (run, gpu))"
        )
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {s}.shapes (code int2 GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
            "util_method text, energy_method text, proc_method text, nulls int4 NOT NULL, throttle text[], "
            "UNIQUE NULLS NOT DISTINCT (util_method, energy_method, proc_method, nulls, throttle))"
        )
        conn.execute(f"CREATE TABLE IF NOT EXISTS {s}.batches (token text PRIMARY KEY, day int4 NOT NULL)")
        # The first day still kept: a late resend of a dropped day is not stored again.
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {s}.kept_from (one bool PRIMARY KEY DEFAULT true CHECK (one), day int4)"
        )
        conn.execute(f"INSERT INTO {s}.kept_from DEFAULT VALUES ON CONFLICT DO NOTHING")
        for table, (columns, not_null) in TABLES.items():
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {s}.{table} ({_columns(columns, not_null)}) PARTITION BY RANGE (day)"
            )


def days(conn: psycopg.Connection, schema: str, table: str) -> dict[int, str]:
    """Day (days since 1970-01-01 UTC) -> partition name, of ``table``'s partitions."""
    q = (
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c "
        "ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)"
    )
    out: dict[int, str] = {}
    for name, bound in conn.execute(q, (f"{schema}.{table}",)):
        m = re.fullmatch(r"FOR VALUES FROM \('?(-?\d+)'?\) TO \('?(-?\d+)'?\)", bound)
        if m:
            out[int(m.group(1))] = name
    return out


def ensure_days(conn: psycopg.Connection, schema: str, wanted: set[int]) -> list[str]:
    """The partitions of both tables for each day in ``wanted``, created where missing (a table of
    its own, indexed while empty, then attached: ATTACH locks the parent only against other DDL,
    not against writers or readers of other days). Their names."""
    created: list[str] = []
    if not wanted:
        return created
    s = check_schema(schema)
    with conn.transaction():
        _lock(conn, s)
        for table in TABLES:
            have = days(conn, s, table)
            for day in sorted(wanted - set(have)):
                name = day_name(table, day)
                conn.execute(f"CREATE TABLE {s}.{name} (LIKE {s}.{table} INCLUDING DEFAULTS)")
                conn.execute(f"CREATE UNIQUE INDEX {name}_key ON {s}.{name} ({KEY_COLUMNS[table]})")
                if table in ODD_INDEX:
                    conn.execute(f"CREATE INDEX {name}_odd ON {s}.{name} {ODD_INDEX[table]}")
                conn.execute(f"ALTER TABLE {s}.{name} ADD CONSTRAINT {name}_bound CHECK (day = {day})")
                conn.execute(
                    f"ALTER TABLE {s}.{table} ATTACH PARTITION {s}.{name} FOR VALUES FROM ({day}) TO ({day + 1})"
                )
                conn.execute(f"ALTER TABLE {s}.{name} DROP CONSTRAINT {name}_bound")
                created.append(name)
    return created


def compact_before(conn: psycopg.Connection, schema: str, cut: int, wait_s: float = COMPACT_WAIT_S) -> list[str]:
    """Rebuild the key index of each day partition before ``cut`` once, full (fillfactor 100: a
    day that ended takes few rows more), marked done by its comment. While a day is written, each
    of its many streams appends in the middle of the index and leaves pages part empty (measured on
    benchmarks/scale_storage.py's day: two-thirds full, 30 B an interval); rebuilt, 20 B.
    ``REINDEX CONCURRENTLY``: writers and readers go on meanwhile, and a late row after it is still
    taken. Needs autocommit (no transaction block around it).

    The rebuild waits for every transaction of the database older than it, whoever's and on
    whatever table: one left open by any client (an idle session, a long migration) would hold
    ``retention run`` and the server's hourly pass for as long. So each waits at most ``wait_s``
    (``lock_timeout``); one that times out leaves the rest for the next pass (the rebuild only
    saves space) and its half-built copy is dropped, here or on the next pass."""
    s = check_schema(schema)
    done: list[str] = []
    q = "SELECT coalesce(obj_description(to_regclass(%s), 'pg_class'), '') = 'compacted'"
    conn.execute(f"SET lock_timeout = {max(1, int(wait_s * 1000))}")
    try:
        for table in TABLES:
            for day, name in sorted(days(conn, s, table).items()):
                index = f"{s}.{name}_key"
                if day >= cut or conn.execute(q, (index,)).fetchone()[0]:  # type: ignore[index]
                    continue
                try:
                    _drop_half_built(conn, s, name)
                    conn.execute(f"ALTER INDEX {index} SET (fillfactor = 100)")
                    conn.execute(f"REINDEX INDEX CONCURRENTLY {index}")
                except psycopg.errors.LockNotAvailable:
                    with contextlib.suppress(psycopg.errors.LockNotAvailable):
                        _drop_half_built(conn, s, name)
                    _log.warning(
                        "series store %s: the index rebuilds of closed days are left for the next pass "
                        "(a transaction of the database older than them stayed open over %g s)",
                        s,
                        wait_s,
                    )
                    return done
                conn.execute(f"COMMENT ON INDEX {index} IS 'compacted'")
                done.append(f"{name}_key")
    finally:
        with contextlib.suppress(psycopg.Error):  # a broken connection: the error above says why
            conn.execute("RESET lock_timeout")
    return done


def _drop_half_built(conn: psycopg.Connection, schema: str, partition: str) -> None:
    """The invalid copies a cancelled ``REINDEX CONCURRENTLY`` left on ``partition`` (``…_ccnew``,
    ``…_ccold``): never used by a query, but written by every insert until dropped."""
    q = (
        "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = to_regclass(%s) AND NOT i.indisvalid"
    )
    for (index,) in conn.execute(q, (f"{schema}.{partition}",)).fetchall():
        with conn.transaction():  # DROP INDEX locks the day's table whole: queued, it would stall its readers
            conn.execute(f"SET LOCAL lock_timeout = {_DROP_WAIT_MS}")
            conn.execute(f'DROP INDEX {schema}."{index}"')


def drop_before(conn: psycopg.Connection, schema: str, cut: int) -> list[int]:
    """DROP TABLE of every partition of a day before ``cut`` (no DELETE of rows); ``kept_from``
    keeps writes from making those days again, so the tokens of batches whose last day is gone are
    forgotten. The days dropped."""
    s = check_schema(schema)
    dropped: set[int] = set()
    with conn.transaction():
        _lock(conn, s)
        for table in TABLES:
            for day, name in days(conn, s, table).items():
                if day < cut:
                    conn.execute(f"DROP TABLE {s}.{name}")
                    dropped.add(day)
        conn.execute(f"UPDATE {s}.kept_from SET day = greatest(day, %s)", (cut,))
        conn.execute(f"DELETE FROM {s}.batches WHERE day < %s", (cut,))
    return sorted(dropped)
