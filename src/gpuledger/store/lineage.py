"""run_lineage kept in step with ``runs.meta``, and the lookups ``gpuledger lineage`` needs (issue 37).

Every write of a run's meta (a new run, ``Ledger.update_run``, a pushed run on the server) calls
``sync``: a training's ``meta.lineage`` and an evaluation's ``meta.evaluation.weights.sha256``
become one row. A training's parent is the training whose best.pt has the sha256 of the weights
it started from; when the recorder could not say (an agent's run pushed before its parent), the
row's parent is found here, and children that arrived first get their parent when it comes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store import schema

TRAINING = "training"
EVALUATION = "evaluation"


def _dict(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def _sha(value: Any) -> str | None:
    text = str(value).lower() if isinstance(value, str) else ""
    return text if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else None


def row_of(run_id: str, meta: Mapping[str, Any] | str | None, started_at: float) -> dict[str, Any] | None:
    """The run_lineage row a run's meta makes, or None (a run that says nothing of its weights)."""
    meta = _dict(meta)
    lineage = _dict(meta.get("lineage"))
    if lineage:
        source = _dict(lineage.get("source_weights"))
        return {
            "run_id": run_id,
            "kind": TRAINING,
            "model_line": lineage.get("model_line") or None,
            "model_version": lineage.get("model_version") or None,
            "weights_sha256": _sha(lineage.get("weights_sha256")),
            "source_sha256": _sha(source.get("sha256")),
            "parent_run": lineage.get("parent_run") or None,
            "started_at": float(started_at),
        }
    if meta.get("kind") == EVALUATION:
        weights = _dict(_dict(meta.get("evaluation")).get("weights"))
        sha = _sha(weights.get("sha256"))
        if sha is None:
            return None
        return {
            "run_id": run_id,
            "kind": EVALUATION,
            "model_line": None,
            "model_version": None,
            "weights_sha256": sha,
            "source_sha256": None,
            "parent_run": None,
            "started_at": float(started_at),
        }
    return None


def producer(
    conn: Connection, weights_sha256: str, before: float | None = None, table: sa.Table | None = None
) -> dict[str, Any] | None:
    """The training that produced these weights (the latest one, when several did: a re-run)."""
    t = schema.run_lineage if table is None else table
    q = sa.select(t).where(t.c.weights_sha256 == weights_sha256, t.c.kind == TRAINING)
    if before is not None:
        q = q.where(t.c.started_at <= before)
    row = conn.execute(q.order_by(t.c.started_at.desc()).limit(1)).mappings().first()
    return None if row is None else dict(row)


def sync(
    conn: Connection,
    run_id: str,
    meta: Mapping[str, Any] | str | None,
    started_at: float | None = None,
    table: sa.Table | None = None,
) -> None:
    """Make run_lineage say what ``meta`` says for this run (insert, replace or delete its row)."""
    t = schema.run_lineage if table is None else table
    if started_at is None:
        started_at = conn.scalar(sa.select(schema.runs.c.started_at).where(schema.runs.c.id == run_id))
        if started_at is None:
            return
    row = row_of(run_id, meta, started_at)
    conn.execute(sa.delete(t).where(t.c.run_id == run_id))
    if row is None:
        return
    if row["kind"] == TRAINING and row["source_sha256"]:
        parent = producer(conn, row["source_sha256"], started_at, t)
        if parent is not None and parent["run_id"] != run_id:
            row["parent_run"] = row["parent_run"] or parent["run_id"]
            row["model_line"] = row["model_line"] or parent["model_line"]
    conn.execute(sa.insert(t).values(row))
    if row["kind"] == TRAINING and row["weights_sha256"]:
        _adopt(conn, t, row)


def _adopt(conn: Connection, t: sa.Table, parent: dict[str, Any]) -> None:
    """Children recorded before their parent (pushes arrive in any order) get it now, and its model
    line, passed down to their own descendants that had none."""
    todo = [parent]
    while todo:
        row = todo.pop()
        q = sa.select(t).where(
            t.c.kind == TRAINING,
            t.c.source_sha256 == row["weights_sha256"],
            t.c.run_id != row["run_id"],
            t.c.started_at >= row["started_at"],
            sa.or_(t.c.parent_run.is_(None), t.c.parent_run == row["run_id"]),
        )
        for kid in [dict(k) for k in conn.execute(q).mappings()]:
            changes = {}
            if kid["parent_run"] is None:
                changes["parent_run"] = row["run_id"]
            if kid["model_line"] is None and row["model_line"] is not None:
                changes["model_line"] = row["model_line"]
            if changes:
                conn.execute(sa.update(t).where(t.c.run_id == kid["run_id"]).values(changes))
                if kid["weights_sha256"] and "model_line" in changes:
                    todo.append({**kid, **changes})


def backfill(conn: Connection, table: sa.Table) -> None:
    """Fill a new run_lineage from the runs already stored (migration 17), oldest first so that
    parents are there before their children."""
    r = schema.runs
    rows = conn.execute(sa.select(r.c.id, r.c.meta, r.c.started_at).order_by(r.c.started_at)).all()
    for run_id, meta, started_at in rows:
        if row_of(run_id, meta, started_at) is not None:
            sync(conn, run_id, meta, started_at, table)


# -- lookups for `gpuledger lineage` ---------------------------------------------------------------


def get(conn: Connection, run_id: str) -> dict[str, Any] | None:
    t = schema.run_lineage
    row = conn.execute(sa.select(t).where(t.c.run_id == run_id)).mappings().first()
    return None if row is None else dict(row)


def by_version(conn: Connection, model_version: str) -> dict[str, Any] | None:
    """The latest training recorded with this model_version."""
    t = schema.run_lineage
    q = sa.select(t).where(t.c.model_version == model_version, t.c.kind == TRAINING)
    row = conn.execute(q.order_by(t.c.started_at.desc()).limit(1)).mappings().first()
    return None if row is None else dict(row)


def children(conn: Connection, run_id: str) -> list[dict[str, Any]]:
    t = schema.run_lineage
    q = sa.select(t).where(t.c.parent_run == run_id, t.c.kind == TRAINING).order_by(t.c.started_at)
    return [dict(r) for r in conn.execute(q).mappings()]


def evaluations(conn: Connection, weights_sha256: str) -> list[str]:
    """Evaluation runs of these weights, oldest first."""
    t = schema.run_lineage
    q = sa.select(t.c.run_id).where(t.c.weights_sha256 == weights_sha256, t.c.kind == EVALUATION)
    return list(conn.scalars(q.order_by(t.c.started_at)))
