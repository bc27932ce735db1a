"""The tier store's own window (docs/SCALE.md, "Tiering"): each ``retention run --series`` drops
the store's whole days older than ``--series-days`` (``drop_days_before``: DROP TABLE of its day
partitions on PostgreSQL, DROP PARTITION on ClickHouse, now rather than whenever the TTL's merge
gets there), recorded once in the trail as ``series.days_dropped`` so that ``audit verify
--series`` names those tiered days as expired, not missing; and runs the compact PostgreSQL
store's maintenance (day partitions made ahead, closed days' key indexes rebuilt), which the team
server also runs at start and hourly.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import date
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.series.base import SeriesStore
from gpuledger.store import audit, capacity_tier, schema, series_day_sums, series_tier
from gpuledger.store.series_tier import Tier

if TYPE_CHECKING:
    from gpuledger.store.ledger import Ledger

ACTION = "series.days_dropped"
OBJECT = "series"  # the trail's object of every entry about a tier store (indexed with the action)
_DAY_S = 86400
_EPOCH = date(1970, 1, 1)


@dataclass
class WindowReport:
    url: str  # without the password
    before: str  # YYYY-MM-DD: the store keeps no day before this one
    # the days (YYYY-MM-DD) past the window now: those the store held, those tiered into it since
    dropped: list[str] = field(default_factory=list)
    made: list[str] = field(default_factory=list)  # partitions and indexes the store's maintenance made


def cut_day(now: float, series_days: int) -> date:
    """The first day kept: a day goes once it began ``series_days`` days ago, when a ClickHouse TTL
    of ``series_days`` may start to expire its rows, so what the TTL removes is always recorded."""
    return date.fromordinal(_EPOCH.toordinal() + int(now // _DAY_S) - series_days + 1)


def maintain(store: SeriesStore, now: float | None = None, *, compact: bool = True) -> list[str]:
    """The store's periodic maintenance where it has one (the compact PostgreSQL store's
    ``maintain()``, ``compact``: its closed days' index rebuilds too; ClickHouse merges by
    itself): what it made."""
    step = getattr(store, "maintain", None)
    return list(step(now, compact=compact)) if callable(step) else []


def _written_since(day: str) -> float:
    """The earliest time an entry tiering ``day`` (YYYY-MM-DD) or a later day can have been
    written: a day is tiered once it is past the ledger's raw window, long after it began, by the
    ledger's own clock; a day's slack for a clock set back since."""
    return (date.fromisoformat(day).toordinal() - _EPOCH.toordinal() - 1) * _DAY_S


def _recorded(conn: Connection, url: str, cut: str) -> list[str]:
    """The days tiered into the store at ``url`` (or holding rows of a series-only run written
    into it) that are before ``cut`` and after the window the last entry for that store recorded:
    what a ClickHouse TTL may have removed before this run."""
    a = schema.audit_log.c
    q = sa.select(a.payload).where(a.object == OBJECT, a.action == ACTION).order_by(a.seq.desc())
    last = next((p for p in map(json.loads, conn.scalars(q)) if p.get("series") == url), None)
    since = last["before"] if last else ""
    days = set()
    tiers = (series_tier.ACTION, capacity_tier.ACTION)  # runs' days and capacity's
    q = sa.select(a.payload).where(a.action.in_(tiers))
    if since:  # only the entries written since the window's first day (ix_audit_log_action_t)
        q = q.where(a.t >= _written_since(since))
    for payload in conn.scalars(q):
        p = json.loads(payload)
        if p.get("series") == url and since <= p["day"] < cut:
            days.add(p["day"])
    # and the days of the series-only runs that write into it (store/series_only_window.py)
    days.update(series_day_sums.store_days(conn, url, since, cut))  # only the window's runs and days read
    return sorted(days)


def keep_window(ledger: Ledger, tier: Tier, *, actor: str, now: float | None = None) -> WindowReport:
    """Drop the tier store's days older than ``tier.series_days`` and record them (the days it
    held and the tiered days past the window, which a ClickHouse TTL may have removed already);
    then its maintenance. The entry and the drop share the ledger's transaction: a drop that fails
    records nothing, and the next run drops and records them."""
    now = time.time() if now is None else now
    cut = cut_day(now, tier.series_days)
    report = WindowReport(tier.url, cut.isoformat())
    held = {d.isoformat() for d in tier.store.raw_days() if d < cut}
    parts = [0]  # days the store dropped, over the transaction's retries

    def tx(conn: Connection) -> None:
        report.dropped = sorted(held.union(_recorded(conn, tier.url, report.before)))
        # ClickHouse lists the days of GPU rows: a day of host rows only is dropped (and counted) too
        parts[0] += tier.store.drop_days_before(cut)
        if parts[0] or report.dropped:
            payload = {"series": tier.url, "before": report.before, "days": report.dropped}
            audit.append(conn, actor=actor, action=ACTION, obj=OBJECT, payload=payload)

    ledger.write(tx)
    report.made = maintain(tier.store, now)
    return report
