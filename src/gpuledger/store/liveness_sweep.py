"""Runs whose agent went silent become ``lost`` on the server; a run that speaks again comes back.

Locally a dead recorder is noticed by its pid (runs/liveness.py); the server cannot see an
agent's processes, only its pushes. A running agent pushes after every flush (seconds), and one
that cannot reach the server retries at least every minute, so a run that has not been heard of
for ``lost_after_s`` (default an hour) is taken for lost: its agent was killed, its machine died,
or it was cut off for good. ``sweep`` (run periodically by every server process; the row lock makes
concurrent sweeps harmless) marks such runs ``lost``, ended at their last sign of life, with the
reason in ``status_reason``, the verdict in ``runs.swept_at`` (a column no push can set: retention,
``audit verify`` and ``revive`` read it, never the reason's text) and a ``run.ended`` audit row by
``server (liveness sweep)``.

The last sign of life is the latest of: the last push (``run_liveness``, noted by every push), the
end of the last host interval, and the run's start.

``lost`` is a verdict drawn from silence, not a fact: when the run's own agent pushes it again as
still running (a long network cut), ``revive_locked`` puts it back to ``running`` (audited,
``run.revived``) in the push's transaction before the push is applied, unless the run was sealed
meanwhile (a push refused for another reason revives nothing: it is rolled back whole); and whatever the
verdict, its owner may still report how the run really ended, within the bounds of
core/audit/run_rules.py (that report clears ``swept_at``: the verdict is then the owner's).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from gpuledger.store import audit, ownership, rollup_stale, schema

if TYPE_CHECKING:
    from gpuledger.store.engine import Database

ACTOR = "server (liveness sweep)"
REASON_PREFIX = "the server heard nothing of this run for"


@dataclass(frozen=True)
class Lost:
    run_id: str
    last_seen: float


def _last_seen() -> tuple[sa.ColumnElement[float], ...]:
    r, live, h = schema.runs.c, schema.run_liveness.c, schema.host_intervals.c
    last_push = sa.select(live.last_push_at).where(live.run_id == r.id).scalar_subquery()
    last_host = sa.select(h.t1).where(h.run_id == r.id).order_by(h.seq.desc()).limit(1).scalar_subquery()
    return r.started_at, sa.func.coalesce(last_push, r.started_at), sa.func.coalesce(last_host, r.started_at)


def silent_runs(conn: Connection, now: float, lost_after_s: float) -> list[Lost]:
    """Runs still ``running`` with no sign of life since ``now - lost_after_s``."""
    r = schema.runs.c
    started, pushed, hosted = _last_seen()
    q = sa.select(r.id, started, pushed, hosted).where(r.status == "running", r.started_at < now - lost_after_s)
    out = []
    for run_id, *times in conn.execute(q):
        last = max(float(t) for t in times)
        if last < now - lost_after_s:
            out.append(Lost(run_id, last))
    return out


def sweep(db: Database, *, lost_after_s: float, now: float | None = None) -> list[str]:
    """Mark silent running runs ``lost``; the ids marked. One transaction per run."""
    if lost_after_s <= 0:
        return []
    now = time.time() if now is None else now
    marked = []
    for candidate in db.read(lambda c: silent_runs(c, now, lost_after_s)):
        if db.write(lambda c, lost=candidate: _mark(db, c, lost, now, lost_after_s)):
            marked.append(candidate.run_id)
    return marked


def _mark(db: Database, conn: Connection, lost: Lost, now: float, lost_after_s: float) -> bool:
    r = schema.runs.c
    q = sa.select(r.status).where(r.id == lost.run_id)
    if db.dialect == "postgresql":
        q = q.with_for_update(skip_locked=True)  # a push holds it: the run is alive
    if conn.execute(q).scalar() != "running":
        return False
    still = [x for x in silent_runs(conn, now, lost_after_s) if x.run_id == lost.run_id]
    if not still:  # a push came in between
        return False
    reason = (
        f"{REASON_PREFIX} {lost_after_s:g} s (no push, no interval); last sign of life at {still[0].last_seen:.0f}; "
        "its agent may still report how it ended"
    )
    values = {"status": "lost", "ended_at": still[0].last_seen, "status_reason": reason}
    conn.execute(sa.update(schema.runs).where(r.id == lost.run_id).values({**values, "swept_at": now}))
    payload = {**values, "exit_code": None, "signal": None, "swept_at": now}
    audit.append(conn, actor=ACTOR, action="run.ended", obj=f"run:{lost.run_id}", payload=payload)
    return True


def swept(status: str | None, swept_at: float | None) -> bool:
    """Whether a run is lost by this sweep's verdict (not by its own agent's report): the column
    the sweep set, never the reason's text (a push may write any reason)."""
    return status == "lost" and swept_at is not None


def revive_locked(conn: Connection, run_id: str, row: Mapping[str, Any], writer: ownership.Writer) -> dict[str, Any]:
    """Put a run the sweep marked lost back to ``running``, because its owner pushed it as running,
    in the push's transaction, which holds the run's ``row`` locked (store/ingest.py): the changed
    fields, or {} (nothing done) when it is not such a run, the writer is not its owner, or it is
    sealed. A run that is not swept costs nothing: the locked row tells."""
    if not swept(row["status"], row["swept_at"]):
        return {}
    owner = ownership.owner_of(conn, run_id)
    if owner is None or owner["user_name"] != writer.user or audit.latest_seal(conn, run_id) is not None:
        return {}
    values = {"status": "running", "ended_at": None, "status_reason": None, "swept_at": None}
    conn.execute(sa.update(schema.runs).where(schema.runs.c.id == run_id).values(values))
    rollup_stale.drop_rollups(conn, [run_id])  # a rollup made while it looked finished
    payload = {"old": {k: row[k] for k in ("status", "ended_at", "status_reason", "swept_at")}}
    audit.append(conn, actor=writer.actor, action="run.revived", obj=f"run:{run_id}", payload=payload)
    return values


@functools.cache
def _note_query(dialect: str) -> Any:
    """``note_push``'s upsert (bound ``run``, ``at``), built once per dialect."""
    ins = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(schema.run_liveness)
    ins = ins.values(run_id=sa.bindparam("run"), last_push_at=sa.bindparam("at"))
    return ins.on_conflict_do_update(index_elements=["run_id"], set_={"last_push_at": ins.excluded.last_push_at})


def note_push(conn: Connection, run_id: str, at: float) -> None:
    """The run was pushed at ``at`` (``run_liveness``, its last sign of life), in the push's transaction."""
    conn.execute(_note_query(conn.dialect.name), {"run": run_id, "at": at})
