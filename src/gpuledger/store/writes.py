"""The statements of the write transactions. Each function runs inside a transaction it is given.

Every insert is ``ON CONFLICT DO NOTHING`` on the record's natural key, so a batch sent twice
(a retry after a lost reply, an outbox replay) leaves the ledger exactly as sending it once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, Metric, RunRecord
from gpuledger.store import bulk, lineage, log_codec, partition_days, rollup_stale, schema
from gpuledger.store.codec import device_from_row, label_rows, run_row, to_row
from gpuledger.store.engine import Database
from gpuledger.store.errors import RunNotFound

# What makes two events / metrics of a run "the same" when the caller does not number them.
_EVENT_KEY = ("t", "kind", "message")
_METRIC_KEY = ("t", "key", "epoch", "step")


def require_run(conn: Connection, run_id: str, *, lock: bool = False) -> None:
    """RunNotFound unless the run exists; ``lock`` holds its row until commit (PostgreSQL), so two
    writers cannot hand out the same event numbers (SQLite's write lock already serialises them)."""
    q = sa.select(schema.runs.c.id).where(schema.runs.c.id == run_id)
    if lock:
        q = q.with_for_update()
    if conn.execute(q).first() is None:
        raise RunNotFound(run_id)


def insert_run(db: Database, conn: Connection, run: RunRecord) -> bool:
    row = run_row(run)
    ins = db.insert(schema.runs).values(row).on_conflict_do_nothing(index_elements=["id"])
    # RETURNING, not rowcount: psycopg reports -1 for INSERT ... ON CONFLICT DO NOTHING.
    if conn.execute(ins.returning(schema.runs.c.id)).first() is None:
        return False  # already there: a replay; later changes go through update_run
    replace_labels(conn, run.id, row["labels"])
    lineage.sync(conn, run.id, row["meta"], run.started_at)
    return True


def replace_labels(conn: Connection, run_id: str, labels: Mapping[str, Any]) -> None:
    conn.execute(sa.delete(schema.run_labels).where(schema.run_labels.c.run_id == run_id))
    rows = label_rows(run_id, labels)
    if rows:
        conn.execute(sa.insert(schema.run_labels), rows)


def upsert_devices(db: Database, conn: Connection, run_id: str, devices: Sequence[GpuIdentity]) -> None:
    require_run(conn, run_id)
    if not devices:
        return
    d = schema.devices
    stored = {r["uuid"]: device_from_row(r) for r in conn.execute(sa.select(d).where(d.c.run_id == run_id)).mappings()}
    if all(stored.get(dev.uuid) == dev for dev in devices):
        return  # sent again as stored (a replay): nothing changed, the run's rollups stand
    ins = db.insert(schema.devices)
    keys = ("run_id", "uuid")
    update = {c.name: ins.excluded[c.name] for c in schema.devices.columns if c.name not in keys}
    conn.execute(
        ins.on_conflict_do_update(index_elements=list(keys), set_=update),
        [to_row(d, run_id=run_id) for d in devices],
    )
    rollup_stale.drop_rollups(conn, [run_id])  # a GPU's name or MIG profile is part of the rows


def append(
    db: Database,
    conn: Connection,
    run_id: str,
    gpu: Sequence[GpuInterval],
    host: Sequence[HostInterval],
    events: Sequence[Event],
    metrics: Sequence[Metric],
    event_seq: int | None,
    metric_seq: int | None,
    run_known: bool = False,
) -> None:
    numbering = (events and event_seq is None) or (metrics and metric_seq is None)
    # A run this ledger already wrote or read needs no look-up: the foreign keys still guard it.
    if numbering or not run_known:
        require_run(conn, run_id, lock=bool(numbering))
    # Only a finished run can have been rolled up (one probe; a recording run's flush stops here):
    # raw rows a rollup already replaced (a replay into it) are dropped, not added again.
    finished = bool(gpu or host) and rollup_stale.run_finished(conn, run_id)
    if finished:
        gpu = bulk.unreplaced(conn, run_id, "gpu", gpu, lambda i: (i.device_uuid, i.seq)) if gpu else gpu
        host = bulk.unreplaced(conn, run_id, "host", host, lambda i: ("", i.seq)) if host else host
    if gpu or host:  # their days' partitions first (PostgreSQL), so none lands in the default one
        starts = {"gpu_intervals": [i.t0 for i in gpu], "host_intervals": [i.t0 for i in host]}
        partition_days.require(db, conn, starts)
    if gpu:
        db.insert_new_rows(conn, schema.gpu_intervals, [to_row(i, run_id=run_id) for i in gpu])
        spans = [(i.device_uuid, i.t0, i.t1) for i in gpu]
        rollup_stale.drop_after_append(conn, run_id, spans, finished=finished)
    if host:
        db.insert_new_rows(conn, schema.host_intervals, [to_row(i, run_id=run_id) for i in host])
    if events:
        rows = [to_row(e, run_id=run_id) for e in events]
        for row in rows:
            row["payload"] = dict(row["payload"] or {})
        rows = _numbered(conn, schema.events, run_id, rows, event_seq, _EVENT_KEY)
        db.insert_new_rows(conn, schema.events, rows)
    if metrics:
        rows = [to_row(m, run_id=run_id) for m in metrics]
        rows = _numbered(conn, schema.metrics, run_id, rows, metric_seq, _METRIC_KEY)
        db.insert_new_rows(conn, schema.metrics, rows)


def _numbered(
    conn: Connection,
    table: sa.Table,
    run_id: str,
    rows: list[dict[str, Any]],
    first_seq: int | None,
    key: tuple[str, ...],
) -> list[dict[str, Any]]:
    """Give each row its ``seq``: ``first_seq``, +1, ... when the caller numbers them; otherwise
    drop rows already stored (same ``key`` values) and continue after the run's last seq."""
    if first_seq is not None:
        for i, row in enumerate(rows):
            row["seq"] = first_seq + i
        return rows
    ts = [row["t"] for row in rows]
    c = table.c
    stored = conn.execute(sa.select(*(c[k] for k in key)).where(c.run_id == run_id, c.t >= min(ts), c.t <= max(ts)))
    seen = {tuple(r) for r in stored}
    fresh = [row for row in rows if tuple(row[k] for k in key) not in seen]
    last = conn.scalar(sa.select(sa.func.max(c.seq)).where(c.run_id == run_id))
    start = 0 if last is None else last + 1
    for i, row in enumerate(fresh):
        row["seq"] = start + i
    return fresh


def set_log(db: Database, conn: Connection, run_id: str, data: bytes, truncated: bool) -> None:
    require_run(conn, run_id)
    data = bytes(data)
    row = {
        "run_id": run_id,
        "data": log_codec.encode(data),  # size_b and sha256 are the log's own
        "sha256": hashlib.sha256(data).hexdigest(),
        "size_b": len(data),
        "truncated": truncated,
    }
    ins = db.insert(schema.logs).values(row)
    update = {k: ins.excluded[k] for k in row if k != "run_id"}
    conn.execute(ins.on_conflict_do_update(index_elements=["run_id"], set_=update))


def delete_run(conn: Connection, run_id: str) -> None:
    # Children explicitly (not only ON DELETE CASCADE): correct even on a connection without FKs.
    for table in schema.RUN_CHILDREN:
        conn.execute(sa.delete(table).where(table.c.run_id == run_id))
    if conn.execute(sa.delete(schema.runs).where(schema.runs.c.id == run_id)).rowcount == 0:
        raise RunNotFound(run_id)
