"""Fast bulk insert of intervals, idempotent, for the team server's ingest.

Rows are sequences in the order of a given column list (the wire's compact form). PostgreSQL: the
keys already stored in the batch's seq range are read (an index-only scan; empty for new data),
the batch is filtered against them, and the rest goes in with ``COPY ... (FORMAT BINARY)``, about
twice as fast as ``INSERT ... ON CONFLICT DO NOTHING``. This is race-free because the caller holds
the run's row lock (``SELECT ... FOR UPDATE`` in store/ingest.py), so two pushes of the same run
never interleave. Other databases: ``INSERT ... ON CONFLICT DO NOTHING`` as an executemany. Raw
intervals a rollup already replaced (rollup_marks) are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store import partition_days, schema
from gpuledger.store.engine import Database

Row = Sequence[Any]
T = TypeVar("T")


def _pg_type(col: sa.Column[Any]) -> str:
    """The PostgreSQL binary COPY type of a column."""
    t = col.type
    base = t.impl if isinstance(t, sa.types.TypeDecorator) else t
    if col.name == "throttle_s" or isinstance(base, sa.JSON):
        return "jsonb"
    if isinstance(base, sa.BigInteger):
        return "int8"
    if isinstance(base, sa.Integer):
        return "int4"
    if isinstance(base, sa.Boolean):
        return "bool"
    if isinstance(base, (sa.Double, sa.Float)):
        return "float8"
    return "text"


Marks = Mapping[str, Mapping[str, int]]  # series ("gpu", "host") -> device uuid ("" for host) -> upto_seq
NO_MARKS: Marks = {"gpu": {}, "host": {}}  # a run retention never rolled up: the usual case


def _marks(conn: Connection, run_id: str, series: str) -> dict[str, int]:
    m = schema.rollup_marks.c
    q = sa.select(m.device_uuid, m.upto_seq).where(m.run_id == run_id, m.series == series)
    return {r.device_uuid: r.upto_seq for r in conn.execute(q)}


def run_marks(conn: Connection, run_id: str) -> Marks:
    """Every series' marks of the run in one query (a push reads them once for its GPU and host rows)."""
    m = schema.rollup_marks.c
    out: dict[str, dict[str, int]] = {"gpu": {}, "host": {}}
    for r in conn.execute(sa.select(m.series, m.device_uuid, m.upto_seq).where(m.run_id == run_id)):
        out.setdefault(r.series, {})[r.device_uuid] = r.upto_seq
    return out


def unreplaced(
    conn: Connection,
    run_id: str,
    series: str,
    rows: Sequence[T],
    key: Callable[[T], tuple[str, int]],
    marks: Mapping[str, int] | None = None,
) -> Sequence[T]:
    """``rows`` of one run's ``series`` ("gpu" or "host") less those a rollup already replaced:
    seq at or below the mark retention left for their device (rollup_marks.upto_seq). ``key(row)``
    gives (device uuid, "" for host rows; seq). Every writer of raw intervals filters through here
    (this bulk path and store/writes.append), so a replay never adds to a rolled-up sum. ``marks``:
    the series' marks as read already in this transaction (``run_marks``); None: read here."""
    if marks is None:
        marks = _marks(conn, run_id, series)
    if not marks:  # the usual case: a run retention never rolled up
        return rows
    return [r for r in rows if key(r)[1] > marks.get(key(r)[0], -1)]


def _stored(conn: Connection, table: sa.Table, run_id: str, seqs: list[int], gpu: bool) -> set[tuple[str, int]]:
    c = table.c
    cols = (c.device_uuid, c.seq) if gpu else (c.seq,)
    q = sa.select(*cols).where(c.run_id == run_id, c.seq >= min(seqs), c.seq <= max(seqs))
    return {(r[0], r[1]) if gpu else ("", r[0]) for r in conn.execute(q)}


def insert_intervals(
    db: Database,
    conn: Connection,
    series: str,
    run_id: str,
    rows: Sequence[Row],
    columns: Sequence[str],
    inserted: list[Row] | None = None,
    *,
    marks: Mapping[str, int] | None = None,
    held: set[tuple[str, int]] | None = None,
) -> tuple[int, int]:
    """Insert the new ``rows`` (``series`` "gpu" or "host", values in ``columns`` order) of one
    run. Returns (inserted, dropped because a rollup already replaced them). ``inserted``
    (PostgreSQL): extended by the rows this call inserted, for live ingest (store/series_live.py).
    ``marks``: as ``unreplaced``. ``held`` (PostgreSQL): the (device uuid or "", seq) keys stored,
    read in this transaction under the run's lock at every seq of ``rows`` and maybe more
    (series_rules.keep_timeline reads them): no second read of the same keys."""
    if not rows:
        return 0, 0
    gpu = series == "gpu"
    table = schema.gpu_intervals if gpu else schema.host_intervals
    seq_at = columns.index("seq")
    uuid_at = columns.index("device_uuid") if gpu else None
    fresh = unreplaced(
        conn, run_id, series, rows, lambda r: (r[uuid_at] if uuid_at is not None else "", r[seq_at]), marks
    )
    dropped = len(rows) - len(fresh)  # rare: a replay of a run that retention already rolled up
    if not fresh:
        return 0, dropped
    if db.dialect != "postgresql":
        return _insert_generic(db, conn, table, run_id, fresh, columns), dropped
    seqs = [r[seq_at] for r in fresh]
    keys = list(zip([r[uuid_at] for r in fresh], seqs, strict=True)) if uuid_at is not None else [("", q) for q in seqs]
    stored = set(held) if held is not None else _stored(conn, table, run_id, seqs, gpu)
    if stored or len(set(keys)) != len(keys):  # a replay, or a key twice in one batch (the first wins)
        new: list[Row] = []
        for key, r in zip(keys, fresh, strict=True):
            if key not in stored:
                stored.add(key)
                new.append(r)
        fresh = new
    if fresh:
        t0_at = columns.index("t0")  # their days' partitions first, so none lands in the default one
        partition_days.require(db, conn, {table.name: [r[t0_at] for r in fresh]})
        _copy(conn, table, run_id, fresh, columns)
        if inserted is not None:
            inserted.extend(fresh)
    return len(fresh), dropped


def _insert_generic(
    db: Database, conn: Connection, table: sa.Table, run_id: str, rows: Sequence[Row], columns: Sequence[str]
) -> int:
    full = [{"run_id": run_id, **dict(zip(columns, r, strict=True))} for r in rows]
    count = sa.select(sa.func.count()).select_from(table).where(table.c.run_id == run_id)
    before = conn.scalar(count) or 0
    db.insert_new_rows(conn, table, full)
    return int((conn.scalar(count) or 0) - before)


def _copy(conn: Connection, table: sa.Table, run_id: str, rows: Sequence[Row], columns: Sequence[str]) -> None:
    import orjson  # the server extra's, like psycopg: store/writes.py uses this module without them
    from psycopg.types.json import set_json_dumps  # PostgreSQL only: psycopg is the postgres extra

    types = ["text", *(_pg_type(table.c[name]) for name in columns)]
    column_list = ", ".join(f'"{n}"' for n in ["run_id", *columns])
    raw = conn.connection.driver_connection  # the psycopg connection, inside this transaction
    with raw.cursor() as cur:
        set_json_dumps(orjson.dumps, cur)  # JSON columns: dicts as they are, dumped by orjson
        with cur.copy(f"COPY {table.name} ({column_list}) FROM STDIN (FORMAT BINARY)") as cp:
            cp.set_types(types)
            write = cp.write_row
            for r in rows:
                write((run_id, *r))
