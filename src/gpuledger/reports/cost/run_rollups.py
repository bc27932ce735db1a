"""A few named runs' use, read as the chargeback reads it: rolled-up runs from their ``gpu_rollups``
rows (by run key), the others from their intervals (``usage.collect_runs``).

What value trends and the /metrics value gauges price (reports/cost/value_trends.values_of): their
runs have ended, so most are rolled up and their raw rows need not be read. A day holding a price
change inside it is the exception, as in the chargeback: a rollup row sums the whole day, so the
runs' intervals of that day are read and cut at the change exactly (``usage._exact_cut_days``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from gpuledger.core.months import month_starts
from gpuledger.core.pricing.cost import Compact, CostLine, Pricer, compact
from gpuledger.core.pricing.usage import DAY_S, day_of
from gpuledger.reports.cost.usage import UsageSet, _exact_cut_days, _logical_ids, _periods, _run_rows, collect_runs
from gpuledger.store import cost_queries as cq

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

__all__ = ["collect_named", "price_named"]


def collect_named(conn: Connection, ids: Sequence[str], *, cuts: Sequence[float] = ()) -> UsageSet:
    """The runs ``ids`` (unscoped: the caller chose them) and what they used: ``rollups`` holds
    the rollup rows of rolled-up runs (frozen ones aside, see ``cq.rollups_of``), ``usages`` the
    rest, read from intervals, and the rolled-up runs' intervals of days with a price change
    inside them (``cuts``: the rate card's change points)."""
    rolled = cq.rollups_of(conn, ids)
    rolled_ids = {row[0] for row in rolled}
    rest = [rid for rid in ids if rid not in rolled_ids]
    usage = collect_runs(conn, rest, scope=None, cuts=cuts) if rest else UsageSet({}, [], {})
    if not rolled:
        return usage
    runs = _logical_ids(conn, _run_rows(cq.run_rows(conn, scope=None, replayed=True, ids=sorted(rolled_ids)), {}), None)
    first, last = min(row[1] for row in rolled), max(row[1] for row in rolled)
    lo, hi = first * DAY_S, (last + 1) * DAY_S
    inside = sorted(c for c in cuts if lo <= c < hi)
    # Periods as the chargeback's: each within one month and one price, a mid-day change a day apart.
    period_days, periods = _periods(sorted({lo, *month_starts(lo, hi), *inside}), inside)
    out = UsageSet({**usage.runs, **runs}, usage.usages, usage.devices, rollups=rolled, periods=periods)
    out.period_of_day = {d: bisect.bisect_right(period_days, d) for d in range(first, last + 1)}
    mid_days = sorted({day_of(c) for c in inside if c % DAY_S})
    if mid_days:
        out.usages += _exact_cut_days(conn, out, mid_days, inside)
    return out


def price_named(pricer: Pricer, usage: UsageSet) -> Iterator[Compact]:
    """Every priced piece of ``collect_named``'s usage, as compact tuples (run_id, model,
    instance_type, month, t0, amounts, flags): the interval-read usages priced one by one, the
    rollup rows in one pass, with the same arithmetic the chargeback uses."""
    lines: list[CostLine] = pricer.price_all(usage.usages)
    yield from map(compact, lines)
    yield from pricer.price_rollups(usage.rollups, usage.runs, usage.period_of_day, usage.periods)
