"""Read queries for the value trends (SQLAlchemy Core, SQLite and PostgreSQL). Read-only.

The finished runs that carry a ``model`` or ``model_version`` label, by the time they ended; the
two figures their value needs from their metrics (best mAP50-95, number of epochs), summed in SQL;
the earlier attempts of resumed ones. ``scope`` (the projects the reader may see; None: all) is in
the WHERE clause of the run query; the other reads take ids that query returned, or the attempts
those ids point to (for arithmetic only: an attempt's gain is measured against them).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.chargeback.value import MAP50_95_KEYS
from gpuledger.store.queries import open_run
from gpuledger.store.schema import metrics, run_labels, runs

__all__ = ["MODEL_LABELS", "ancestors", "finished_model_runs", "metric_figures", "run_meta"]

MODEL_LABELS = ("model", "model_version")
_CHUNK = 1000
_COLUMNS = ("id", "status", "user", "team", "project", "name", "started_at", "ended_at", "attempt_of", "labels", "meta")


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


def finished_model_runs(
    conn: Connection,
    *,
    scope: frozenset[str] | None,
    start: float,
    end: float,
    limit: int | None = None,
    replayed: bool = True,
) -> list[dict[str, Any]]:
    """Runs in scope that ended in [start, end), are no longer recording, were metered here (not
    imported) and carry a model or model_version label; newest end first, at most ``limit``.
    Without ``replayed``, not those metered from a replayed GPU trace (demos: not billed)."""
    r = runs.c
    labelled = sa.exists().where(run_labels.c.run_id == r.id, run_labels.c.key.in_(MODEL_LABELS))
    q = (
        sa.select(*(r[c] for c in _COLUMNS))
        .where(r.ended_at >= start, r.ended_at < end, ~open_run(r), r.status != "imported", labelled)
        .order_by(r.ended_at.desc(), r.id)
    )
    if scope is not None:
        q = q.where(r.project.in_(sorted(scope)) if scope else sa.false())
    if not replayed:
        q = q.where(r.replayed == sa.false())
    if limit is not None:
        q = q.limit(limit)
    return [dict(row) for row in conn.execute(q).mappings()]


def _finite(conn: Connection) -> sa.ColumnElement[bool]:
    """Metric values that are numbers: NaN is stored as the text 'NaN' on SQLite and sorts above
    every number on PostgreSQL, so a plain max() would return it."""
    if conn.dialect.name == "sqlite":
        return sa.func.typeof(metrics.c.value) != "text"
    return metrics.c.value != sa.literal_column("'NaN'::double precision")


def metric_figures(conn: Connection, ids: Sequence[str]) -> dict[str, tuple[float | None, int]]:
    """run id -> (best mAP50-95 over the Ultralytics keys, number of distinct epochs with metrics)."""
    m = metrics.c
    out: dict[str, tuple[float | None, int]] = {}
    for chunk in _chunks(list(ids)):
        best = sa.select(m.run_id, sa.func.max(m.value)).where(
            m.run_id.in_(chunk), m.key.in_(MAP50_95_KEYS), _finite(conn)
        )
        maps = dict(conn.execute(best.group_by(m.run_id)).all())
        counted = sa.select(m.run_id, sa.func.count(sa.distinct(m.epoch))).where(
            m.run_id.in_(chunk), m.epoch.is_not(None)
        )
        epochs = dict(conn.execute(counted.group_by(m.run_id)).all())
        for rid in chunk:
            value = maps.get(rid)
            out[rid] = (None if value is None else float(value), int(epochs.get(rid) or 0))
    return out


def ancestors(conn: Connection, rows: Iterable[dict[str, Any]], max_depth: int = 100) -> dict[str, list[str]]:
    """run id -> the earlier attempts it resumes (following ``attempt_of``), nearest first, for the
    rows that resume one. Unscoped: an attempt's gain is measured against its own chain."""
    parent = {row["id"]: row["attempt_of"] for row in rows if row["attempt_of"]}
    known: dict[str, str | None] = dict(parent)
    wanted = {p for p in parent.values() if p not in known}
    for _ in range(max_depth):
        if not wanted:
            break
        found: dict[str, str | None] = {rid: None for rid in wanted}
        for chunk in _chunks(sorted(wanted)):
            q = sa.select(runs.c.id, runs.c.attempt_of).where(runs.c.id.in_(chunk))
            found.update(conn.execute(q).all())
        known.update(found)
        wanted = {p for p in found.values() if p and p not in known}
    out: dict[str, list[str]] = {}
    for rid in parent:
        chain, seen, at = [], {rid}, known.get(rid)
        while at and at not in seen:  # a cycle written by hand would otherwise never end
            chain.append(at)
            seen.add(at)
            at = known.get(at)
        out[rid] = chain
    return out


def run_meta(conn: Connection, ids: Collection[str]) -> dict[str, dict[str, Any]]:
    """run id -> its ``meta`` (for runs that exist)."""
    out: dict[str, dict[str, Any]] = {}
    for chunk in _chunks(sorted(ids)):
        q = sa.select(runs.c.id, runs.c.meta).where(runs.c.id.in_(chunk))
        out.update((rid, meta or {}) for rid, meta in conn.execute(q))
    return out
