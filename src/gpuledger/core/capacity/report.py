"""The capacity report: the fleet's time and asset cost in each state, by host, GPU model or pool,
and the cost no run was billed for shared back to teams. Pure: the use case (reports/capacity/report.py)
reads the day sums, the fleet and the teams' billed cost, and hands them here.

Exactness. Each GPU's time on one day and host (a *cell*: core/capacity/cells.py) is five parts in
milliseconds — the four states and ``unobserved`` (in the fleet, but no agent watched) — turned
into micro-GPU-hours once, by largest remainder, so the parts add up to the cell's hours whatever
the grouping. Cost is linear in those integers (money.gpu_money), so hours are summed per group and
price line first and priced once: the same 10^-21 units as pricing every cell, and every group,
state and total adds up exactly. A day in which a GPU's price changes is cut at the change in
proportion to time (the day sums hold no finer detail).

A GPU is in the fleet from its first to its last sighting (FleetGpu), clipped to the window.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuledger.core.capacity.cells import CellPricer, cells
from gpuledger.core.capacity.columns import CAPACITY_KEYS, SHARE_RULES
from gpuledger.core.capacity.model import FleetGpu, apportion, ms
from gpuledger.core.capacity.pools import Pools
from gpuledger.core.capacity.totals import CapacityTotals, ratio
from gpuledger.core.chargeback.totals import hours
from gpuledger.core.money import money_str
from gpuledger.core.pricing.ratecard import RateCard

__all__ = ["CapacityReport", "CapacityTotals", "TeamBill", "build_capacity", "share_pool"]


@dataclass(frozen=True)
class TeamBill:
    """What the runs of one team were billed in the window, and their hours (the share weights)."""

    team: str | None
    allocated_uh: int
    busy_uh: int
    billed: int  # 10^-21 currency


@dataclass
class CapacityReport:
    """Everything the capacity report shows; rows are JSON-ready (core/capacity/columns.COLUMNS)."""

    params: dict[str, Any]
    groups: list[dict[str, Any]]
    total: dict[str, Any]
    shares: list[dict[str, Any]]
    shares_total: dict[str, Any] | None
    sources: dict[str, Any]
    warnings: list[str]
    total_units: CapacityTotals = field(repr=False, default_factory=CapacityTotals)
    group_units: dict[tuple[Any, ...], CapacityTotals] = field(repr=False, default_factory=dict)
    shared_units: dict[str | None, int] = field(repr=False, default_factory=dict)  # team -> shared idle

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.params,
            "groups": self.groups,
            "total": self.total,
            "shares": self.shares,
            "shares_total": self.shares_total,
            "sources": self.sources,
            "warnings": self.warnings,
        }


def share_pool(pool: int, weights: Sequence[int]) -> list[int]:
    """``pool`` money units split in proportion to ``weights`` (µh), exactly: the parts add up to
    the pool (largest remainder; a negative pool is split as its opposite). No weight: nothing."""
    if not any(weights):
        return [0] * len(weights)
    parts = apportion(abs(pool), list(weights))
    return parts if pool >= 0 else [-p for p in parts]


def build_capacity(
    *,
    gpus: Iterable[FleetGpu],
    day_rows: Iterable[Sequence[Any]],
    card: RateCard,
    pools: Pools,
    start: float,
    end: float,
    by: Sequence[str] = ("host",),
    share_rule: str = "none",
    bills: Sequence[TeamBill] = (),
    params: Mapping[str, Any] | None = None,
    warnings: Sequence[str] = (),
    on_piece: Callable[[tuple[Any, ...]], None] | None = None,
) -> CapacityReport:
    """The report of [start, end) (whole UTC days). ``day_rows``: (gpu_uuid, day, host, first_ms,
    last_ms, unallocated_ms, alloc_idle_ms, busy_attr_ms, busy_unattr_ms, unmeasured_ms, energy_j)
    as store/capacity_queries.day_rows gives them (agent) or reports/capacity_runs derives them
    (runs); ``bills``: each team's billed cost and hours, for ``share_rule`` allocated or busy;
    ``on_piece``: called with each priced piece, (gpu uuid, host, day, pool, model, instance type,
    rate line or None, state µh x5, unmeasured µh, energy mWh, start of the piece in epoch s), for
    exports that keep GPU-days and prices apart (core/capacity/focus.py)."""
    bad = [k for k in by if k not in CAPACITY_KEYS]
    if bad or not by:
        raise ValueError(f"group by one or more of {', '.join(CAPACITY_KEYS)} (got {', '.join(by) or 'nothing'})")
    if share_rule not in SHARE_RULES:
        raise ValueError(f"share idle cost by one of {', '.join(SHARE_RULES)}, not {share_rule!r}")
    start_ms, end_ms = ms(start), ms(end)
    fleet = {g.uuid: g for g in gpus}
    rows_of: dict[str, dict[int, list[Sequence[Any]]]] = {}
    for row in day_rows:
        if row[0] in fleet:
            rows_of.setdefault(row[0], {}).setdefault(row[1], []).append(row)
    pricer = CellPricer(card, pools, by, on_piece)
    for gpu in fleet.values():
        for host, day, cell in cells(gpu, rows_of.get(gpu.uuid, {}), start_ms, end_ms):
            pricer.add(gpu, host, day, cell)
    acc = pricer.finish()
    total = CapacityTotals()
    for t in acc.values():
        total.merge(t)
    group_rows = []
    for key in sorted(acc, key=lambda k: tuple((v is None, v or "") for v in k)):
        group_rows.append({**dict(zip(by, key, strict=True)), **acc[key].row(total)})
    total_row = {**{k: ("TOTAL" if i == 0 else None) for i, k in enumerate(by)}, **total.row(total)}
    notes = [*warnings, *pricer.notes(total)]
    shares, shares_total, shared_units = _shares(share_rule, bills, total, notes)
    header = {"by": list(by), "share_idle": share_rule, "currency": card.currency, "from": _iso(start), "to": _iso(end)}
    return CapacityReport(
        params={**dict(params or {}), **header},
        groups=group_rows,
        total=total_row,
        shares=shares,
        shares_total=shares_total,
        sources={"gpus": len(total.gpus), **_source_counts(fleet.values(), total.gpus)},
        warnings=notes,
        total_units=total,
        group_units=acc,
        shared_units=shared_units,
    )


def _source_counts(gpus: Iterable[FleetGpu], counted: set[str]) -> dict[str, int]:
    out = {"agent_gpus": 0, "run_gpus": 0}
    for g in gpus:
        if g.uuid in counted:
            out["agent_gpus" if g.source == "agent" else "run_gpus"] += 1
    return out


def _team_row(b: TeamBill, weight: int, whole: int, part: int) -> dict[str, Any]:
    return {
        "team": b.team,
        "allocated_gpu_h": hours(b.allocated_uh),
        "busy_gpu_h": hours(b.busy_uh),
        "weight": ratio(weight, whole),
        "billed_cost": money_str(b.billed),
        "shared_idle_cost": money_str(part),
        "total_cost": money_str(b.billed + part),
    }


def _shares(
    rule: str, bills: Sequence[TeamBill], total: CapacityTotals, notes: list[str]
) -> tuple[list[dict[str, Any]], dict[str, Any] | None, dict[str | None, int]]:
    """Rows of the shares section: the cost no run was billed for (fleet cost - billed), split
    by the teams' allocated or busy hours."""
    if rule == "none":
        return [], None, {}
    pool = total.fleet_cost - sum(b.billed for b in bills)
    weights = [b.allocated_uh if rule == "allocated" else b.busy_uh for b in bills]
    parts = share_pool(pool, weights)
    whole = sum(weights)
    if not whole:
        notes.append(
            f"no team has {rule} hours in the window: the fleet's unbilled cost {money_str(pool)} is not shared"
        )
    if pool < 0:
        notes.append(f"the runs were billed {money_str(-pool)} more than the fleet cost: check that the pools "
                     "file prices each host as its runs are priced (instance types), and that every GPU the "
                     "runs used is in the fleet")  # fmt: skip
    ordered = sorted(zip(bills, weights, parts, strict=True), key=lambda x: (x[0].team is None, x[0].team or ""))
    rows = [_team_row(b, w, whole, part) for b, w, part in ordered]
    everyone = TeamBill("TOTAL", sum(b.allocated_uh for b in bills), sum(b.busy_uh for b in bills),
                        sum(b.billed for b in bills))  # fmt: skip
    total_row = _team_row(everyone, whole, whole, sum(parts))
    return rows, total_row, {b.team: part for b, part in zip(bills, parts, strict=True)}


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).isoformat().replace("+00:00", "Z")
