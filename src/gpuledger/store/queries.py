"""Read queries that do more than fetch rows: run listing filters and SQL-side totals.

Totals are plain SUM/MIN/MAX over the intervals (re-aggregation is a sum: docs/ARCHITECTURE.md). SUM over no
values is NULL, so a figure no interval measured comes back as None, not 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.model import DISCOVERED, UTIL_INSTANT
from gpuledger.store.schema import gpu_intervals, host_intervals, run_labels, runs


def open_run(c: Any = runs.c) -> sa.ColumnElement[bool]:
    """SQL for core.model.run_is_open: ``running``, or ``discovered`` without an end yet."""
    return sa.or_(c.status == "running", sa.and_(c.status == DISCOVERED, c.ended_at.is_(None)))


def open_discovered_on(conn: Connection, host: str) -> list[Any]:
    """Rows of the discovered runs of ``host`` that have no end yet (a node agent resumes them)."""
    q = sa.select(runs).where(runs.c.status == DISCOVERED, runs.c.ended_at.is_(None), runs.c.host == host)
    return list(conn.execute(q.order_by(runs.c.started_at, runs.c.id)).mappings())


def _sum_int(col: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    # PostgreSQL sums bigint into numeric (a Decimal in Python); counts of bytes fit in bigint.
    return sa.cast(sa.func.sum(col), sa.BigInteger)


def list_runs_query(
    *,
    project: str | None = None,
    team: str | None = None,
    user: str | None = None,
    status: str | None = None,
    since: float | None = None,
    labels: Mapping[str, Any] | None = None,
    limit: int | None = None,
) -> sa.Select[Any]:
    q = sa.select(runs)
    for col, value in ((runs.c.project, project), (runs.c.team, team), (runs.c.user, user)):
        if value is not None:
            q = q.where(col == value)
    if status is not None:
        q = q.where(runs.c.status == status)
    if since is not None:
        q = q.where(runs.c.started_at >= since)
    for key, value in (labels or {}).items():
        q = q.where(
            sa.exists().where(
                run_labels.c.run_id == runs.c.id,
                run_labels.c.key == str(key),
                run_labels.c.value == str(value),
            )
        )
    q = q.order_by(runs.c.started_at.desc(), runs.c.id.desc())
    if limit is not None:
        q = q.limit(limit)
    return q


def unmeasured_sql(g: Any) -> Any:
    """Per GPU interval, ``core.metering.busy.unmeasured_seconds``: the stored exact figure, else
    (rows stored before it) the unknown time capped at the span unless the interval's method
    includes the instant reading (which measured it). NULL where the interval says nothing of
    how its busy time was covered (no unknown time recorded either)."""
    span = g.t1 - g.t0
    lost = sa.and_(g.util_unknown_s > 0, sa.func.coalesce(g.util_method, "").not_like(f"%{UTIL_INSTANT}%"), span > 0)
    legacy = sa.case(
        (g.util_unknown_s.is_(None), sa.null()),
        (lost, sa.case((g.util_unknown_s < span, g.util_unknown_s), else_=span)),
        else_=0.0,
    )
    return sa.func.coalesce(g.util_unmeasured_s, legacy)


def gpu_totals(conn: Connection, run_id: str) -> dict[str, dict[str, Any]]:
    g = gpu_intervals.c
    q = (
        sa.select(
            g.device_uuid,
            sa.func.count().label("count"),
            _sum_int(g.samples).label("samples"),
            sa.func.min(g.t0).label("t0"),
            sa.func.max(g.t1).label("t1"),
            sa.func.sum(g.busy_s).label("busy_s"),
            sa.func.count(g.busy_s).label("busy_count"),
            sa.func.sum(g.util_idle_s).label("util_idle_s"),
            sa.func.sum(g.util_unknown_s).label("util_unknown_s"),
            sa.func.sum(unmeasured_sql(g)).label("util_unmeasured_s"),
            sa.func.sum(g.energy_j).label("energy_j"),
            sa.func.count(g.energy_j).label("energy_count"),
            sa.func.max(g.power_max_w).label("power_max_w"),
            sa.func.max(g.util_max_pct).label("util_max_pct"),
            sa.func.max(g.mem_used_max_b).label("mem_used_max_b"),
            sa.func.max(g.mem_reserved_b).label("mem_reserved_b"),
            sa.func.max(g.proc_mem_max_b).label("proc_mem_max_b"),
            sa.func.max(g.temp_max_c).label("temp_max_c"),
            sa.func.max(g.mem_clock_max_mhz).label("mem_clock_max_mhz"),
        )
        .where(g.run_id == run_id)
        .group_by(g.device_uuid)
        .order_by(g.device_uuid)
    )
    out: dict[str, dict[str, Any]] = {}
    for row in conn.execute(q).mappings():
        totals = dict(row)
        out[totals.pop("device_uuid")] = totals
    return out


def host_totals(conn: Connection, run_id: str) -> dict[str, Any]:
    h = host_intervals.c
    span = h.t1 - h.t0
    util_span = sa.case((h.sys_cpu_util_avg_pct.is_not(None), span))
    q = sa.select(
        sa.func.count().label("count"),
        _sum_int(h.samples).label("samples"),
        sa.func.min(h.t0).label("t0"),
        sa.func.max(h.t1).label("t1"),
        sa.func.sum(h.cpu_s).label("cpu_s"),
        sa.func.max(h.rss_max_b).label("rss_max_b"),
        _sum_int(h.read_b).label("read_b"),
        _sum_int(h.write_b).label("write_b"),
        sa.func.max(h.threads_max).label("threads_max"),
        sa.func.max(h.procs_max).label("procs_max"),
        # Time-weighted over the intervals that measured it.
        (sa.func.sum(h.sys_cpu_util_avg_pct * span) / sa.func.nullif(sa.func.sum(util_span), 0)).label(
            "sys_cpu_util_avg_pct"
        ),
        sa.func.sum(h.iowait_s).label("iowait_s"),
        sa.func.max(h.sys_mem_used_max_b).label("sys_mem_used_max_b"),
        _sum_int(h.disk_read_b).label("disk_read_b"),
        _sum_int(h.disk_write_b).label("disk_write_b"),
        _sum_int(h.net_rx_b).label("net_rx_b"),
        _sum_int(h.net_tx_b).label("net_tx_b"),
    ).where(h.run_id == run_id)
    return dict(conn.execute(q).mappings().one())


def last_flush_t(conn: Connection, run_id: str) -> float | None:
    ends = [
        conn.scalar(sa.select(sa.func.max(t.c.t1)).where(t.c.run_id == run_id)) for t in (gpu_intervals, host_intervals)
    ]
    known = [t for t in ends if t is not None]
    return max(known) if known else None
