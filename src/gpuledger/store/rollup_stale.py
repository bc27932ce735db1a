"""Dropping rollups a later write made stale, so cost reports never price an outdated sum.

A run's ``gpu_rollups`` rows sum its GPU intervals as they were when it was rolled up, split
against the runs it shared a GPU with. They go stale when intervals arrive later (an agent's outbox
replayed after the run ended), when the run's GPUs or its fields change, and, for a shared GPU,
when a co-tenant's intervals change. Stale rows are deleted and the run's ``rolled_up`` flag is
cleared in the writing transaction: reports then read the run from its intervals until the next
``gpuledger report rollup`` writes fresh rows.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.model import run_is_open
from gpuledger.store import rollup_audit
from gpuledger.store.partitions import DROPPED_LEVEL
from gpuledger.store.schema import devices, gpu_rollups, rollup_marks, runs

__all__ = ["ROLLUP_FIELDS", "drop_after_append", "drop_rollups", "frozen", "run_finished"]

# Run fields a rollup depends on: its held span, its status, and the values rows are grouped by.
ROLLUP_FIELDS = frozenset({"status", "started_at", "ended_at", "labels", "user", "attempt_of"})
_DAY_S = 86400
_CHUNK = 2000


def frozen(run_id: sa.ColumnElement[str]) -> sa.ColumnElement[bool]:
    """Whether the run lost raw intervals with a dropped day partition (store/retention_days.py):
    its rollups were written from rows that are gone, so they stay as they are, never rebuilt."""
    m = rollup_marks.c
    return sa.exists().where(m.run_id == run_id, m.level_s >= DROPPED_LEVEL)


def drop_rollups(conn: Connection, run_ids: Collection[str]) -> None:
    """Delete the rollup rows of ``run_ids`` and mark them not rolled up, but those of frozen runs.
    Rows exist only for runs flagged rolled up (both are written and dropped together), so for a
    run not flagged this is one index probe."""
    ids = sorted(run_ids)
    dropped: list[str] = []
    for i in range(0, len(ids), _CHUNK):
        chunk = ids[i : i + _CHUNK]
        unflag = (
            sa.update(runs).where(runs.c.id.in_(chunk), runs.c.rolled_up, ~frozen(runs.c.id)).values(rolled_up=False)
        )
        flagged = list(conn.scalars(unflag.returning(runs.c.id)))
        if flagged:
            conn.execute(sa.delete(gpu_rollups).where(gpu_rollups.c.run_id.in_(flagged)))
            dropped += flagged
    rollup_audit.record_dropped(conn, dropped)  # a team ledger's trail says so (store/rollup_audit.py)


def run_finished(conn: Connection, run_id: str) -> bool:
    """The run exists and has ended: only such a run can have been rolled up (one primary-key probe)."""
    row = conn.execute(sa.select(runs.c.status, runs.c.ended_at).where(runs.c.id == run_id)).first()
    return row is not None and not run_is_open(row.status, row.ended_at)


def drop_after_append(
    conn: Connection, run_id: str, spans: Sequence[tuple[str, float, float]], *, finished: bool | None = None
) -> None:
    """After GPU intervals (device uuid, t0, t1) were added to ``run_id``: if it has already ended
    (a late replay), drop its rollups and those of the runs that held one of the same GPUs on the
    same days. A running run is never rolled up, nor is anything chained to it on its GPUs
    (reports/cost/rollups.py), so the usual append, while recording, costs one primary-key probe."""
    if not spans:
        return
    if not (run_finished(conn, run_id) if finished is None else finished):
        return
    first = math.floor(min(t0 for _, t0, _ in spans) / _DAY_S)
    last = math.floor(max(t1 for _, _, t1 in spans) / _DAY_S)
    uuids = sorted({uuid for uuid, _, _ in spans})
    tenants = sa.select(devices.c.run_id).where(devices.c.uuid.in_(uuids))
    q = sa.select(gpu_rollups.c.run_id).where(
        gpu_rollups.c.run_id.in_(tenants), gpu_rollups.c.day >= first, gpu_rollups.c.day <= last
    )
    drop_rollups(conn, {run_id, *conn.scalars(q.distinct())})
