"""The chargeback as a FOCUS 1.0 cost-and-usage dataset (docs/FOCUS.md): read, price, make rows.

The window is read and priced exactly as ``costing.chargeback`` prices it (the same usage reader,
the same Pricer, the same cuts at month boundaries, price changes and the window's edges), but
every priced piece is kept with its run and UTC day instead of being summed into groups, so the
rows add up to the chargeback's totals to the last unit. The chargeback's columnar fast path is
not used here: it sums before a piece's day is known.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from gpuledger.core.chargeback.focus import FocusExport, FocusIdentity, build_focus
from gpuledger.core.chargeback.focus_shared import shared_idle_rows
from gpuledger.core.chargeback.report import Chargeback
from gpuledger.core.pricing.cost import Compact, Pricer, compact, month_starts
from gpuledger.core.pricing.ratecard import RateCard
from gpuledger.reports.cost.replayed import replayed_warning
from gpuledger.reports.cost.usage import Scope, UsageSet, collect_report, read
from gpuledger.store.cost_queries import replayed_in_window
from gpuledger.store.label_queries import labels_of
from gpuledger.store.series_cut_days import CutDays

if TYPE_CHECKING:
    from gpuledger.store import Ledger

__all__ = ["add_shared_idle_rows", "chargeback_focus", "default_identity"]


def default_identity(card: RateCard, provider: str | None = None) -> FocusIdentity:
    """Who provides the GPU time: ``provider`` when given, else the rate card's name, else gpuledger."""
    return FocusIdentity((provider or "").strip() or card.name or "gpuledger")


def chargeback_focus(
    ledger: Ledger,
    *,
    scope: Scope,
    card: RateCard,
    start: float,
    end: float,
    basis: str | None = None,
    identity: FocusIdentity | None = None,
    include_replayed: bool = False,
) -> FocusExport:
    """The FOCUS rows of [start, end): one per UTC day, run, GPU model, instance type and price.
    Runs of a replayed GPU trace only with ``include_replayed``, flagged ``replayed`` (x_Flags);
    a note says which were left out or put in."""
    cut_times = sorted({start, end} | {t for t in card.change_points if start < t < end})
    edges = {start, *month_starts(start, end), *cut_times}
    pricer = Pricer(card, basis, start, end)
    series = CutDays.of(ledger)  # a series-only run's days with a price change, read from its store

    def collect(conn: Any) -> tuple[UsageSet, dict[str, dict[str, str]]]:
        usage = collect_report(
            conn,
            scope=scope,
            trend_start=start,
            start=start,
            end=end,
            edges=edges,
            cut_times=cut_times,
            group_keys=[],
            replayed=include_replayed,
            series=series,
        )
        demo = [rid for rid, run in usage.runs.items() if run.replayed] if include_replayed else []
        if not include_replayed:
            demo = replayed_in_window(conn, scope=scope, start=start, end=end)
        return usage, labels_of(conn, list(usage.runs)), demo

    usage, labels, demo = read(ledger, collect)
    items: Iterable[Compact] = itertools.chain(
        (compact(ln) for ln in pricer.price_all(usage.usages)),
        pricer.price_rollups(usage.rollups, usage.runs, usage.period_of_day, usage.periods),
    )
    export = build_focus(
        items,
        usage.runs,
        labels,
        card=card,
        basis=str(pricer.basis),
        start=start,
        end=end,
        identity=identity or default_identity(card),
    )
    if demo:
        export.notes.append(replayed_warning(sorted(demo), include_replayed))
    export.notes.extend(series.notes())
    return export


def add_shared_idle_rows(export: FocusExport, cb: Chargeback, *, card: RateCard, start: float, end: float,
                         identity: FocusIdentity) -> FocusExport:  # fmt: skip
    """A copy of ``export`` with a row per group of ``cb`` (a chargeback of the same window after
    reports/capacity/report.add_shared_idle) for its part of the fleet's unbilled cost; ValueError when
    the window is not inside one calendar month."""
    rows = shared_idle_rows(
        cb.groups,
        by=cb.params["by"],
        rule=cb.params["share_idle"],
        fleet_cost=cb.params["fleet_cost"],
        billed=cb.total["cost"],
        card=card,
        basis=export.basis,
        start=start,
        end=end,
        identity=identity,
    )
    return FocusExport([*export.rows, *rows], list(export.notes), export.currency, export.basis)
