"""The days of a series-only run (store/series_segments.py) its series store has dropped past its
own window: ``retention run --series`` drops the store's whole days older than ``--series-days``
and records it as ``series.days_dropped`` (store/series_window.py), for every run the store holds,
series-only runs included. Such a run's raw curves of those days are gone; its per-day sums
(``series_day_sums``), its segments and the seal of its intervals stay in the ledger, so its
figures and cost stay, and ``audit verify --series`` names those days expired, not missing.
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.model import GpuInterval
from gpuledger.store import schema, series_day_sums, series_window


def kept_from(conn: Connection, shown: str) -> str:
    """The first day (YYYY-MM-DD) the store ``shown`` (its URL without the password) still keeps by
    the trail's ``series.days_dropped`` entries; "" when it never dropped a day."""
    a = schema.audit_log.c
    q = sa.select(a.payload).where(a.object == series_window.OBJECT, a.action == series_window.ACTION)
    found = [json.loads(p) for p in conn.scalars(q)]
    return max((str(p["before"]) for p in found if p.get("series") == shown), default="")


def expired_days(conn: Connection, run_id: str) -> list[str]:
    """The days of the series-only run ``run_id`` its store no longer keeps (none for another run)."""
    m = schema.series_only_runs.c
    store = conn.scalar(sa.select(m.store).where(m.run_id == run_id))
    if store is None:
        return []
    kept = kept_from(conn, str(store))
    return [day for day in series_day_sums.run_days(conn, run_id) if day < kept] if kept else []


def expired_note(days: list[str]) -> str:
    """What ``report run`` and ``show`` say of a series-only run with expired days."""
    span = days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"
    return (
        f"raw curves of {len(days)} day{'s' if len(days) != 1 else ''} ({span}) expired from the series store "
        "(dropped past its window): busy time, energy and interval counts per GPU are the ledger's day sums; "
        "peaks, memory and host figures, which only the raw rows give, are n/a"
    )


def day_sum_intervals(conn: Connection, run_id: str) -> tuple[list[GpuInterval], dict[str, int]]:
    """The run's day sums folded into one interval per GPU (first start, last end, busy time and
    energy; None where no row measured them) and each GPU's row count: the figures that outlive
    the store's window, as ``Ledger.gpu_rollups`` gives them for a run whose rows the ledger holds."""
    d = schema.series_day_sums.c
    q = (
        sa.select(
            d.device_uuid,
            sa.func.min(d.t0),
            sa.func.max(d.t1),
            sa.func.sum(d.busy_s),
            sa.func.sum(d.energy_j),
            sa.func.sum(d.intervals),
        )
        .where(d.run_id == run_id)
        .group_by(d.device_uuid)
    )
    gpu, counts = [], {}
    for uuid, t0, t1, busy, energy, n in conn.execute(q.order_by(d.device_uuid)):
        gpu.append(
            GpuInterval(
                str(uuid), 0, float(t0), float(t1),
                busy_s=None if busy is None else float(busy), energy_j=None if energy is None else float(energy),
            )
        )  # fmt: skip
        counts[str(uuid)] = int(n or 0)
    return gpu, counts
