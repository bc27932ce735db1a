"""One agent push, written in one transaction: run upsert (audited), devices, intervals, events,
metrics, and the run's seal when it is finished.

Idempotent like the rest of the store: intervals are keyed by (run, device, seq) / (run, seq),
events and metrics by (run, seq) as numbered by the agent's local ledger; a resent batch inserts
nothing. The run's row is locked first (PostgreSQL: SELECT ... FOR UPDATE), so pushes of one run
from several replicas are serialised and the bulk path (store/bulk.py) can use COPY safely.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.model import RunRecord
from gpuledger.store import audit, bulk, codec, rollup_stale, schema, writes
from gpuledger.store.engine import Database

FINAL = frozenset({"succeeded", "failed", "killed", "lost", "imported"})


@dataclass
class IngestOutcome:
    run_id: str
    created: bool = False
    gpu_intervals: int = 0
    host_intervals: int = 0
    events: int = 0
    metrics: int = 0
    dropped_rolled_up: int = 0
    sealed: bool = False


class NotYours(Exception):
    """The run exists but belongs to a project the writer may not write (answered as 404)."""


def _insert_numbered(db: Database, conn: Connection, table: sa.Table, run_id: str, rows: list[dict[str, Any]]) -> int:
    if not rows:
        return 0
    for r in rows:
        r["run_id"] = run_id
    ins = db.insert(table).on_conflict_do_nothing().returning(table.c.seq)
    return sum(len(conn.execute(ins.values(chunk)).all()) for chunk in _chunks(rows, 500))


def _chunks(rows: list[dict[str, Any]], n: int) -> list[list[dict[str, Any]]]:
    return [rows[i : i + n] for i in range(0, len(rows), n)]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def _upsert_run(
    db: Database, conn: Connection, run: RunRecord, actor: str, authorize: Callable[[str | None, str | None], None]
) -> tuple[bool, bool]:
    """(created, changed). ``authorize(existing_project, new_project)`` raises to refuse."""
    r = schema.runs.c
    q = sa.select(schema.runs).where(r.id == run.id)
    if db.dialect == "postgresql":
        q = q.with_for_update()
    existing = conn.execute(q).mappings().first()
    new_row = codec.run_row(run)
    if existing is None:
        authorize(None, new_row["project"])
        if writes.insert_run(db, conn, run):
            info = {k: new_row[k] for k in ("project", "team", "user", "host", "name", "status", "started_at")}
            audit.append(conn, actor=actor, action="run.created", obj=f"run:{run.id}", payload=info)
            if run.status in FINAL:
                _audit_end(conn, actor, run.id, new_row)
            return True, True
        existing = conn.execute(q).mappings().first()  # a concurrent push created it just now
        assert existing is not None
    authorize(existing["project"], new_row["project"])
    if existing["status"] in FINAL and new_row["status"] == "running":
        return False, False  # a stale push never reopens a finished run
    changes = {k: v for k, v in new_row.items() if k != "id" and not _same(existing[k], v)}
    if not changes:
        return False, False
    conn.execute(sa.update(schema.runs).where(r.id == run.id).values(changes))
    if "labels" in changes:
        writes.replace_labels(conn, run.id, changes["labels"])
        payload = {"old": existing["labels"], "new": changes["labels"]}
        audit.append(conn, actor=actor, action="run.labels_changed", obj=f"run:{run.id}", payload=payload)
    if "status" in changes and new_row["status"] in FINAL:
        _audit_end(conn, actor, run.id, new_row)
    return False, True


def _audit_end(conn: Connection, actor: str, run_id: str, row: Mapping[str, Any]) -> None:
    info = {k: row[k] for k in ("status", "ended_at", "exit_code", "signal", "status_reason")}
    audit.append(conn, actor=actor, action="run.ended", obj=f"run:{run_id}", payload=info)


def ingest(
    db: Database,
    *,
    run: RunRecord,
    devices: Sequence[Mapping[str, Any]],
    gpu: Sequence[Sequence[Any]],
    host: Sequence[Sequence[Any]],
    gpu_columns: Sequence[str],
    host_columns: Sequence[str],
    events: Sequence[Mapping[str, Any]],
    metrics: Sequence[Mapping[str, Any]],
    final: bool,
    actor: str,
    authorize: Callable[[str | None, str | None], None],
) -> IngestOutcome:
    def tx(conn: Connection) -> IngestOutcome:
        out = IngestOutcome(run.id)
        out.created, changed = _upsert_run(db, conn, run, actor, authorize)
        if devices:
            ins = db.insert(schema.devices)
            keys = ("run_id", "uuid")
            update = {c.name: ins.excluded[c.name] for c in schema.devices.columns if c.name not in keys}
            conn.execute(
                ins.on_conflict_do_update(index_elements=list(keys), set_=update),
                [{**d, "run_id": run.id} for d in devices],
            )
        out.gpu_intervals, d1 = bulk.insert_intervals(db, conn, "gpu", run.id, gpu, gpu_columns)
        if out.gpu_intervals:  # new rows only: a resent batch changes nothing
            at = [gpu_columns.index(c) for c in ("device_uuid", "t0", "t1")]
            rollup_stale.drop_after_append(conn, run.id, [(r[at[0]], r[at[1]], r[at[2]]) for r in gpu])
        elif devices or (changed and not out.created):
            rollup_stale.drop_rollups(conn, [run.id])
        out.host_intervals, d2 = bulk.insert_intervals(db, conn, "host", run.id, host, host_columns)
        out.dropped_rolled_up = d1 + d2
        out.events = _insert_numbered(db, conn, schema.events, run.id, [dict(e) for e in events])
        out.metrics = _insert_numbered(db, conn, schema.metrics, run.id, [dict(m) for m in metrics])
        wrote = changed or bool(devices) or any((out.gpu_intervals, out.host_intervals, out.events, out.metrics))
        if run.status in FINAL and (final or (wrote and audit.latest_seal(conn, run.id) is not None)):
            out.sealed = (
                audit.seal_run(conn, run.id, actor=actor, reason="final push" if final else "late push") is not None
            )
        return out

    return db.write(tx)


def set_log(db: Database, *, run_id: str, data: bytes, truncated: bool, actor: str,
            authorize: Callable[[str | None], None]) -> bool:  # fmt: skip
    """Store a run's log; reseal the run when it is sealed. False if the run does not exist."""

    def tx(conn: Connection) -> bool:
        project = conn.execute(sa.select(schema.runs.c.project).where(schema.runs.c.id == run_id)).first()
        if project is None:
            return False
        authorize(project[0])
        writes.set_log(db, conn, run_id, data, truncated)
        if audit.latest_seal(conn, run_id) is not None:
            audit.seal_run(conn, run_id, actor=actor, reason="log stored")
        return True

    return db.write(tx)
