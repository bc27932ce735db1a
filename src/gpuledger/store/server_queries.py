"""Read queries of the team server, each restricted to a scope (the projects the reader may see;
None = all) in its WHERE clause, so rows outside it never leave the database."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.model import RunRecord
from gpuledger.store import codec, queries, schema

Scope = frozenset[str] | None
ALERT_KINDS = ("alert", "oom", "nan_loss")


def in_scope(scope: Scope) -> sa.ColumnElement[bool]:
    if scope is None:
        return sa.true()
    if not scope:
        return sa.false()
    return schema.runs.c.project.in_(sorted(scope))


def list_runs(
    conn: Connection,
    scope: Scope,
    *,
    project: str | None = None,
    team: str | None = None,
    user: str | None = None,
    status: str | None = None,
    since: float | None = None,
    labels: Mapping[str, Any] | None = None,
    limit: int = 50,
) -> list[RunRecord]:
    q = queries.list_runs_query(
        project=project, team=team, user=user, status=status, since=since, labels=labels, limit=limit
    ).where(in_scope(scope))
    return [codec.run_from_row(r) for r in conn.execute(q).mappings()]


def busy_by_run(conn: Connection, run_ids: Collection[str]) -> dict[str, tuple[int, float | None]]:
    """run id -> (GPUs with intervals, busy seconds summed; None when none measured)."""
    if not run_ids:
        return {}
    g = schema.gpu_intervals.c
    q = (
        sa.select(g.run_id, sa.func.count(sa.distinct(g.device_uuid)), sa.func.sum(g.busy_s))
        .where(g.run_id.in_(sorted(run_ids)))
        .group_by(g.run_id)
    )
    return {r[0]: (int(r[1]), None if r[2] is None else float(r[2])) for r in conn.execute(q)}


def visible_run(conn: Connection, run_id: str, scope: Scope) -> RunRecord | None:
    q = sa.select(schema.runs).where(schema.runs.c.id == run_id, in_scope(scope))
    row = conn.execute(q).mappings().first()
    return None if row is None else codec.run_from_row(row)


def intervals_page(
    conn: Connection, run_id: str, after_t: float | None, limit: int
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """GPU and host interval rows with t1 > after_t, oldest first, at most ``limit`` per series."""
    out = []
    for table, order in ((schema.gpu_intervals, ("t0", "device_uuid")), (schema.host_intervals, ("t0",))):
        q = sa.select(table).where(table.c.run_id == run_id)
        if after_t is not None:
            q = q.where(table.c.t1 > after_t)
        q = q.order_by(*(table.c[k] for k in order)).limit(limit)
        out.append([dict(r) for r in conn.execute(q).mappings()])
    return out[0], out[1]


def recent_alerts(
    conn: Connection, scope: Scope, *, since: float | None, limit: int, kinds: tuple[str, ...] = ALERT_KINDS
) -> list[dict[str, Any]]:
    e, r = schema.events.c, schema.runs.c
    q = (
        sa.select(e.run_id, e.seq, e.t, e.kind, e.message, e.payload, r.name, r.project, r.team, r.user)
        .join(schema.runs, r.id == e.run_id)
        .where(e.kind.in_(kinds), in_scope(scope))
        .order_by(e.t.desc(), e.run_id, e.seq.desc())
        .limit(limit)
    )
    if since is not None:
        q = q.where(e.t >= since)
    out = []
    for row in conn.execute(q).mappings():  # mappings: a Row's .t is a method of Row itself
        item = dict(row)
        item["run_name"] = item.pop("name")
        out.append(item)
    return out


def run_project(conn: Connection, run_id: str) -> tuple[bool, str | None]:
    """(exists, project label) of a run, for a writer's check before it uploads anything."""
    row = conn.execute(sa.select(schema.runs.c.project).where(schema.runs.c.id == run_id)).first()
    return (False, None) if row is None else (True, row[0])
