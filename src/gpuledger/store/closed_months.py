"""Closed months: once a month's bill is out, no push may add to it.

A UTC month closes ``close_after_days`` days (``gpuledger serve --close-after-days``, default 3)
after it ends: the days late agents get to deliver what they recorded before the bill is made.
From then on the server refuses, as store/ingest.py applies it:

- a new run that started before the boundary (409: a run of a closed month cannot be created);
- any interval, event or metric dated before the boundary (quarantined per row, like rows outside
  the run's span).
- a node's capacity interval dated before it, and a sighting seen only before it; a GPU new to the
  fleet whose first sighting lies before it enters the fleet at the boundary (store/capacity_guard.py).

``audit verify`` lists the runs the trail shows created after their month closed (their
``run.created`` row is later than the close of the month they started in): written before this
rule, by a server with a longer window, or around the server.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.months import month_bounds, month_of
from gpuledger.store import schema

DEFAULT_CLOSE_AFTER_DAYS = 3.0
DAY_S = 86400.0
ADOPTED = "adopted by an admin"  # a run.created an admin wrote for a run found in the ledger: checked by hand


def boundary(now: float, close_after_days: float = DEFAULT_CLOSE_AFTER_DAYS) -> float:
    """The first instant of the earliest month still open at ``now``: everything before it is final."""
    start, _ = month_bounds(month_of(now))
    while now < start + max(0.0, close_after_days) * DAY_S:  # the month before ``start`` is still open
        start = month_bounds(month_of(start - 1.0))[0]
    return start


def closes_at(t: float, close_after_days: float = DEFAULT_CLOSE_AFTER_DAYS) -> float:
    """When the month holding ``t`` closes."""
    return month_bounds(month_of(t))[1] + close_after_days * DAY_S


def show(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def created_late(conn: Connection, close_after_days: float = DEFAULT_CLOSE_AFTER_DAYS) -> Iterator[str]:
    """Problems for ``audit verify``: runs whose ``run.created`` row came after their month closed."""
    a, r = schema.audit_log.c, schema.runs.c
    q = (
        sa.select(r.id, r.started_at, sa.func.min(a.t), sa.func.min(a.seq))
        .join(schema.audit_log, a.object == sa.literal("run:") + r.id)
        .where(a.action == "run.created", a.payload.not_like(f"%{ADOPTED}%"))
        .group_by(r.id, r.started_at)
        .order_by(r.id)
    )
    for run_id, started_at, created_t, seq in conn.execute(q):
        closed = closes_at(float(started_at), close_after_days)
        if float(created_t) > closed:
            yield (
                f"run {run_id}: started {show(float(started_at))} but created at audit seq {seq} "
                f"({show(float(created_t))}), after its month closed ({show(closed)}): it changed a closed bill"
            )
