"""``gpuledger audit seal``: an admin's approval of what the trail cannot vouch for by itself.

Three things can be left outside the trail's seals, and each needs a person to look before it is
approved:

- a finished run whose agent never sent its last batch: recorded by gpuledger (``run.created``),
  but never sealed;
- a run with no ``run.created`` entry at all (written into the database some other way): never
  approved in bulk, only by naming it (``adopt``);
- cost rollups written before rollups were audited (an upgraded ledger).

``pending`` lists them with what would be approved; ``approve`` seals / records them, each entry
naming the approving actor and reason. Nothing tampered with after a seal is ever approved here:
a sealed run that differs from its seal stays reported by ``verify``.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.model import run_is_open
from gpuledger.store import audit, rollup_audit
from gpuledger.store import schema as T
from gpuledger.store.errors import LedgerError
from gpuledger.store.queries import open_run

if TYPE_CHECKING:
    from gpuledger.store.ledger import Ledger


@dataclass
class Pending:
    unsealed: list[dict[str, Any]] = field(default_factory=list)  # finished, created by gpuledger, no seal
    foreign: list[dict[str, Any]] = field(default_factory=list)  # no run.created entry
    rollups: list[str] = field(default_factory=list)  # rolled-up runs whose rollups are not in the trail


def _trail_runs(conn: Connection) -> tuple[set[str], set[str], set[str]]:
    a = T.audit_log.c
    run_of = sa.func.substr(a.object, 5)
    q = sa.select(run_of, a.action).where(a.object.like("run:%"), a.action.in_(("run.created", *audit.SEAL_ACTIONS)))
    created, sealed = set(), set()
    for run_id, action in conn.execute(q):
        (created if action == "run.created" else sealed).add(str(run_id))
    rolled = set()
    for payload in conn.scalars(sa.select(a.payload).where(a.action == rollup_audit.WRITTEN)):
        rolled |= set(json.loads(payload).get("runs", {}))
    return created, sealed, rolled


def _describe(conn: Connection, run_ids: Sequence[str]) -> list[dict[str, Any]]:
    r, g = T.runs.c, T.gpu_intervals.c
    out = []
    for i in range(0, len(run_ids), 500):
        chunk = list(run_ids[i : i + 500])
        counts = dict(
            conn.execute(sa.select(g.run_id, sa.func.count()).where(g.run_id.in_(chunk)).group_by(g.run_id)).all()
        )
        busy = dict(
            conn.execute(sa.select(g.run_id, sa.func.sum(g.busy_s)).where(g.run_id.in_(chunk)).group_by(g.run_id)).all()
        )
        q = sa.select(r.id, r.user, r.host, r.project, r.status, r.started_at, r.ended_at).where(r.id.in_(chunk))
        for row in conn.execute(q.order_by(r.started_at)).mappings():
            out.append({**row, "gpu_intervals": int(counts.get(row["id"], 0)), "busy_s": busy.get(row["id"])})
    return out


def pending(ledger: Ledger) -> Pending:
    def tx(conn: Connection) -> Pending:
        created, sealed, rolled = _trail_runs(conn)
        r = T.runs.c
        finished = list(conn.scalars(sa.select(r.id).where(~open_run(r))))
        everything = list(conn.scalars(sa.select(r.id)))
        out = Pending()
        out.unsealed = _describe(conn, sorted(i for i in finished if i in created and i not in sealed))
        out.foreign = _describe(conn, sorted(i for i in everything if i not in created))
        flagged = set(conn.scalars(sa.select(r.id).where(r.rolled_up)))
        out.rollups = sorted(flagged - rolled)
        return out

    return ledger.read(tx)


def unsealed_among(conn: Connection, run_ids: Collection[str]) -> list[str] | None:
    """Of the finished runs ``run_ids``, those the audit trail holds no seal of (sorted): their rows
    are not protected until an admin approves them. None on a ledger that keeps no trail."""
    if not rollup_audit.audited(conn):
        return None
    a = T.audit_log.c
    ids = sorted(run_ids)
    sealed: set[str] = set()
    for i in range(0, len(ids), 500):  # through the index on object, a chunk at a time
        objects = [f"run:{x}" for x in ids[i : i + 500]]
        q = sa.select(a.object).where(a.object.in_(objects), a.action.in_(audit.SEAL_ACTIONS)).distinct()
        sealed.update(conn.scalars(q))
    return [x for x in ids if f"run:{x}" not in sealed]


def approve(
    ledger: Ledger, *, actor: str, runs: Sequence[str] = (), adopt: Sequence[str] = (), rollups: bool = False
) -> list[str]:
    """Seal the finished ``runs`` (each must be unsealed and created by gpuledger), adopt the
    ``adopt`` runs (recorded as created by ``actor``, then sealed), and record the rollups of
    rolled-up runs the trail does not hold. Returns what was done, one line each."""
    done: list[str] = []
    todo = pending(ledger)
    unsealed = {d["id"] for d in todo.unsealed}
    foreign = {d["id"]: d for d in todo.foreign}
    for run_id in runs:
        if run_id not in unsealed:
            raise LedgerError(f"run {run_id} is not a finished, unsealed run recorded by gpuledger; nothing to approve")
    for run_id in adopt:
        if run_id not in foreign:
            raise LedgerError(f"run {run_id} has a run.created entry or does not exist; nothing to adopt")
    for run_id in runs:
        ledger.write(lambda c, r=run_id: audit.seal_run(c, r, actor=actor, reason="approved by an admin: never sealed"))
        done.append(f"sealed run {run_id}")
    for run_id in adopt:
        d = foreign[run_id]

        def tx(conn: Connection, r: str = run_id, info: dict[str, Any] = d) -> None:
            payload = {k: info[k] for k in ("project", "user", "host", "status", "started_at")}
            payload |= {"owner": None, "reason": "adopted by an admin: written outside gpuledger"}
            audit.append(conn, actor=actor, action="run.created", obj=f"run:{r}", payload=payload)
            if not run_is_open(info["status"], info["ended_at"]):
                audit.seal_run(conn, r, actor=actor, reason="adopted by an admin")

        ledger.write(tx)
        done.append(f"adopted run {run_id}")
    if rollups and todo.rollups:
        ledger.write(lambda c: _record_rollups(c, todo.rollups, actor))
        done.append(f"recorded the rollups of {len(todo.rollups)} runs")
    return done


def _record_rollups(conn: Connection, run_ids: Sequence[str], actor: str) -> None:
    g = T.gpu_rollups
    for i in range(0, len(run_ids), 2000):
        chunk = list(run_ids[i : i + 2000])
        rows = [dict(r) for r in conn.execute(sa.select(g).where(g.c.run_id.in_(chunk))).mappings()]
        rollup_audit.record_written(conn, chunk, rows, actor=actor)
