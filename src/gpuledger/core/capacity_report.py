"""The capacity report: the fleet's time and asset cost in each state, by host, GPU model or pool,
and the cost no run was billed for shared back to teams. Pure: the use case (reports/capacity.py)
reads the day sums, the fleet and the teams' billed cost, and hands them here.

Exactness. Each GPU's time on one day and host (a *cell*) is five parts in milliseconds — the four
states and ``unobserved`` (in the fleet, but no agent watched) — turned into micro-GPU-hours once,
by largest remainder (core/capacity.to_uh), so the parts add up to the cell's hours whatever the
grouping. Cost is linear in those integers (money.gpu_money), so hours are summed per group and
price line first and priced once: the same 10^-21 units as pricing every cell, and every group,
state and total adds up exactly. A day in which a GPU's price changes is cut at the change in
proportion to time (the day sums hold no finer detail).

A GPU is in the fleet from its first to its last sighting (FleetGpu), clipped to the window.
"""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuledger.core.capacity import DAY_MS, FleetGpu, apportion, ms, to_uh
from gpuledger.core.capacity_columns import CAPACITY_KEYS, SHARE_RULES
from gpuledger.core.capacity_pools import Pools
from gpuledger.core.chargeback_totals import hours
from gpuledger.core.money import gpu_money, joules_to_mwh, money_str
from gpuledger.core.ratecard import RateCard, RateLine

__all__ = ["CapacityReport", "CapacityTotals", "TeamBill", "build_capacity", "share_pool"]

_ENERGY_SCALE = 10**9  # energy units: 10^-9 kWh, as the chargeback's


@dataclass
class CapacityTotals:
    """Exact sums of one group: hours in µh (10^-6 GPU-h), energy in 10^-9 kWh, money in 10^-21."""

    gpus: set[str] = field(default_factory=set)
    unallocated_uh: int = 0
    alloc_idle_uh: int = 0
    busy_attr_uh: int = 0
    busy_unattr_uh: int = 0
    unobserved_uh: int = 0
    unmeasured_uh: int = 0
    unpriced_uh: int = 0
    energy: int = 0
    unallocated_cost: int = 0
    alloc_idle_cost: int = 0
    busy_attr_cost: int = 0
    busy_unattr_cost: int = 0
    unobserved_cost: int = 0
    energy_cost: int = 0

    @property
    def fleet_uh(self) -> int:
        return self.unallocated_uh + self.alloc_idle_uh + self.busy_attr_uh + self.busy_unattr_uh + self.unobserved_uh

    @property
    def observed_uh(self) -> int:
        return self.fleet_uh - self.unobserved_uh

    @property
    def asset_cost(self) -> int:
        return (
            self.unallocated_cost + self.alloc_idle_cost + self.busy_attr_cost + self.busy_unattr_cost
            + self.unobserved_cost
        )  # fmt: skip

    @property
    def fleet_cost(self) -> int:
        return self.asset_cost + self.energy_cost

    def merge(self, other: CapacityTotals) -> None:
        self.gpus |= other.gpus
        for name in _SUMMED:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def row(self, whole: CapacityTotals) -> dict[str, Any]:
        """The documented columns (core/capacity_columns.COLUMNS["groups"])."""
        observed = self.observed_uh
        return {
            "gpus": len(self.gpus),
            "fleet_gpu_h": hours(self.fleet_uh),
            "unallocated_gpu_h": hours(self.unallocated_uh),
            "alloc_idle_gpu_h": hours(self.alloc_idle_uh),
            "busy_attributed_gpu_h": hours(self.busy_attr_uh),
            "busy_unattributed_gpu_h": hours(self.busy_unattr_uh),
            "unobserved_gpu_h": hours(self.unobserved_uh),
            "unmeasured_gpu_h": hours(self.unmeasured_uh),
            "allocated_share": _ratio(self.alloc_idle_uh + self.busy_attr_uh, observed),
            "busy_share": _ratio(self.busy_attr_uh + self.busy_unattr_uh, observed),
            "observed_share": _ratio(observed, self.fleet_uh),
            "energy_kwh": round(self.energy / _ENERGY_SCALE, 9),
            "asset_cost": money_str(self.asset_cost),
            "unallocated_cost": money_str(self.unallocated_cost),
            "alloc_idle_cost": money_str(self.alloc_idle_cost),
            "busy_attributed_cost": money_str(self.busy_attr_cost),
            "busy_unattributed_cost": money_str(self.busy_unattr_cost),
            "unobserved_cost": money_str(self.unobserved_cost),
            "energy_cost": money_str(self.energy_cost),
            "fleet_cost": money_str(self.fleet_cost),
            "unpriced_gpu_h": hours(self.unpriced_uh),
            "share": _ratio(self.fleet_cost, whole.fleet_cost),
        }


_SUMMED = (
    "unallocated_uh", "alloc_idle_uh", "busy_attr_uh", "busy_unattr_uh", "unobserved_uh", "unmeasured_uh",
    "unpriced_uh", "energy", "unallocated_cost", "alloc_idle_cost", "busy_attr_cost", "busy_unattr_cost",
    "unobserved_cost", "energy_cost",
)  # fmt: skip
_PARTS = ("unallocated", "alloc_idle", "busy_attr", "busy_unattr", "unobserved")


def _ratio(part: int, whole: int) -> float | None:
    return None if whole <= 0 else round(part / whole, 6)


@dataclass(frozen=True)
class TeamBill:
    """What the runs of one team were billed in the window, and their hours (the share weights)."""

    team: str | None
    allocated_uh: int
    busy_uh: int
    billed: int  # 10^-21 currency


@dataclass
class CapacityReport:
    """Everything the capacity report shows; rows are JSON-ready (core/capacity_columns.COLUMNS)."""

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


class _Pricing:
    """Rate lines by (model, instance type, day), with the times a price changes within the day."""

    def __init__(self, card: RateCard) -> None:
        self.card = card
        self._models: dict[str, str] = {}
        self._lines: dict[tuple[str, str | None, int], tuple[RateLine | None, list[int]]] = {}

    def model(self, name: str) -> str:
        key = self._models.get(name)
        if key is None:
            key = self._models[name] = self.card.models.match(name) or name
        return key

    def on_day(self, model: str, instance: str | None, day: int) -> tuple[RateLine | None, list[int]]:
        """(the line at the day's start, change times inside the day in ms)."""
        key = (model, instance, day)
        found = self._lines.get(key)
        if found is None:
            a, b = day * DAY_MS / 1000, (day + 1) * DAY_MS / 1000
            cuts = [ms(t) for t in self.card.cuts(model, instance, a, b)]
            found = self._lines[key] = (self.card.line_at(model, instance, a), cuts)
        return found


def _add_priced(acc: CapacityTotals, line: RateLine | None, uh: Sequence[int], unmeasured: int, mwh: int) -> None:
    acc.unallocated_uh += uh[0]
    acc.alloc_idle_uh += uh[1]
    acc.busy_attr_uh += uh[2]
    acc.busy_unattr_uh += uh[3]
    acc.unobserved_uh += uh[4]
    acc.unmeasured_uh += unmeasured
    if line is None:
        acc.unpriced_uh += sum(uh)
        acc.energy += mwh * 1000
        return
    rate = line.rate_u
    acc.unallocated_cost += gpu_money(uh[0], rate)
    acc.alloc_idle_cost += gpu_money(uh[1], rate)
    acc.busy_attr_cost += gpu_money(uh[2], rate)
    acc.busy_unattr_cost += gpu_money(uh[3], rate)
    acc.unobserved_cost += gpu_money(uh[4], rate)
    units = mwh * line.pue_m
    acc.energy += units
    acc.energy_cost += units * line.energy_u


def _pieces(parts: list[int], lengths: list[int]) -> list[list[int]]:
    """``parts`` split into pieces of the given relative ``lengths``: each piece's total in
    proportion to its length, each part handed out piece by piece among what is left, so the
    pieces add up to every part exactly."""
    totals = apportion(sum(parts), lengths)
    left = list(parts)
    out = []
    for n, total in enumerate(totals):
        piece = list(left) if n == len(totals) - 1 else apportion(total, left)
        out.append(piece)
        left = [a - b for a, b in zip(left, piece, strict=True)]
    return out


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
    rate line or None, state µh x5, unmeasured µh, energy mWh), for exports that keep GPU-days
    and prices apart (core/focus_capacity.py)."""
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
    pricer = _CellPricer(card, pools, by, on_piece)
    for gpu in fleet.values():
        for host, day, cell in _cells(gpu, rows_of.get(gpu.uuid, {}), start_ms, end_ms):
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


# A cell: one GPU's time on one day and host: [unallocated, alloc_idle, busy_attr, busy_unattr,
# unobserved, unmeasured] ms, energy J, first ms, last ms, whether energy was measured.
_Cell = list[Any]


def _cells(
    gpu: FleetGpu, rows_by_day: Mapping[int, list[Sequence[Any]]], start_ms: int, end_ms: int
) -> Iterator[tuple[str, int, _Cell]]:
    """The GPU's cells in the window: its day rows per host, and the time it was in the fleet but
    not observed, put on the host it was seen on most that day (else the host it was on then)."""
    p0, p1 = max(ms(gpu.first_seen), start_ms), min(ms(gpu.last_seen), end_ms)
    days = set(rows_by_day)
    if p1 > p0:
        days.update(range(p0 // DAY_MS, (p1 - 1) // DAY_MS + 1))
    stays = sorted(gpu.hosts, key=lambda h: h.first_seen)
    for day in sorted(days):
        d0 = day * DAY_MS
        a, b = max(p0, d0), min(p1, d0 + DAY_MS)
        rows = rows_by_day.get(day, ())
        if len(rows) == 1:  # the common case: one host all day
            r = rows[0]
            unobserved = max(0, b - a) - (r[5] + r[6] + r[7] + r[8])
            energy = r[10]
            cell = [r[5], r[6], r[7], r[8], 0, r[9], energy or 0.0, r[3], r[4], energy is not None]
            if unobserved > 0:
                cell[4], cell[7], cell[8] = unobserved, min(r[3], a), max(r[4], b)
            yield r[2], day, cell
            continue
        per_host: dict[str, _Cell] = {}
        for r in rows:
            cell = per_host.setdefault(r[2], [0, 0, 0, 0, 0, 0, 0.0, r[3], r[4], False])
            for i in range(4):
                cell[i] += r[5 + i]
            cell[5] += r[9]
            if r[10] is not None:
                cell[6] += r[10]
                cell[9] = True
            cell[7], cell[8] = min(cell[7], r[3]), max(cell[8], r[4])
        observed = sum(c[0] + c[1] + c[2] + c[3] for c in per_host.values())
        unobserved = max(0, b - a) - observed
        if unobserved > 0:
            host = max(per_host, key=lambda h: sum(per_host[h][:4])) if per_host else _host_on(gpu, stays, d0)
            cell = per_host.setdefault(host, [0, 0, 0, 0, 0, 0, 0.0, a, b, False])
            cell[4] += unobserved
            cell[7], cell[8] = min(cell[7], a), max(cell[8], b)
        yield from ((host, day, cell) for host, cell in per_host.items())


class _CellPricer:
    """Cells into the groups' exact sums: hours once per cell, summed per group and price line,
    priced once per (group, line) at the end (``finish``): cost is linear in the integers, so this
    is the same to the unit as pricing every cell, and a year of a large fleet stays fast."""

    def __init__(
        self, card: RateCard, pools: Pools, by: Sequence[str], on_piece: Callable[[tuple[Any, ...]], None] | None
    ) -> None:
        self.card, self.pools, self.by, self.on_piece = card, pools, tuple(by), on_piece
        self.pricing = _Pricing(card)
        self.groups: dict[tuple[Any, ...], CapacityTotals] = {}
        self.unknown_models: set[str] = set()
        self.unpriced: set[str] = set()
        self._context: dict[tuple[str, str], tuple[str, str | None, str, tuple[Any, ...]]] = {}
        # (group key, id of the line) -> [5 state µh, unmeasured µh, energy mWh] (a line is one object)
        self._sums: dict[tuple[tuple[Any, ...], int], list[int]] = {}
        self._lines: dict[int, RateLine | None] = {}

    def _of(self, gpu: FleetGpu, host: str) -> tuple[str, str | None, str, tuple[Any, ...]]:
        """(model, instance type, pool, group key) of a GPU on a host, worked out once."""
        found = self._context.get((gpu.uuid, host))
        if found is None:
            model = self.pricing.model(gpu.name)
            if model == gpu.name and self.card.models.match(gpu.name) is None:
                self.unknown_models.add(gpu.name)
            instance = self.pools.instance_type(host, gpu.instance_type)
            pool = self.pools.name(host, instance, model)
            key = _key(self.by, host, model, pool, gpu.uuid)
            totals = self.groups.get(key)
            if totals is None:
                totals = self.groups[key] = CapacityTotals()
            totals.gpus.add(gpu.uuid)
            found = self._context[(gpu.uuid, host)] = (model, instance, pool, key)
        return found

    def add(self, gpu: FleetGpu, host: str, day: int, cell: _Cell) -> None:
        model, instance, pool, key = self._of(gpu, host)
        uh = to_uh(cell[:5])
        unmeasured = to_uh([cell[5], max(0, sum(cell[:5]) - cell[5])])[0] if cell[5] else 0
        mwh = joules_to_mwh(cell[6]) if cell[9] else 0
        line, cuts = self.pricing.on_day(model, instance, day)
        inside = [c for c in cuts if cell[7] < c < cell[8]] if cuts else cuts
        where = (gpu.uuid, host, day, pool, model, instance)
        if not inside:
            self._add(key, line, uh, unmeasured, mwh, where)
            return
        edges = [cell[7], *inside, cell[8]]
        lengths = [b - a for a, b in itertools.pairwise(edges)]
        for a, piece in zip(edges, _pieces([*uh, unmeasured, mwh], lengths), strict=False):
            line = self.card.line_at(model, instance, a / 1000)
            self._add(key, line, piece[:5], piece[5], piece[6], where)

    def _add(self, key: tuple[Any, ...], line: RateLine | None, uh: Sequence[int], unmeasured: int, mwh: int,
             where: tuple[Any, ...]) -> None:  # fmt: skip
        acc = self._sums.get((key, id(line)))
        if acc is None:
            acc = self._sums[(key, id(line))] = [0, 0, 0, 0, 0, 0, 0]
            self._lines[id(line)] = line
            if line is None:
                self.unpriced.add(where[4] + (f" on {where[5]}" if where[5] else ""))
        acc[0] += uh[0]
        acc[1] += uh[1]
        acc[2] += uh[2]
        acc[3] += uh[3]
        acc[4] += uh[4]
        acc[5] += unmeasured
        acc[6] += mwh
        if self.on_piece is not None:
            self.on_piece((*where, line, tuple(uh), unmeasured, mwh))

    def finish(self) -> dict[tuple[Any, ...], CapacityTotals]:
        """The groups' totals: each (group, line)'s summed integers priced once."""
        for (key, line_id), v in self._sums.items():
            _add_priced(self.groups[key], self._lines[line_id], v[:5], v[5], v[6])
        self._sums = {}
        return self.groups

    def notes(self, total: CapacityTotals) -> list[str]:
        out = []
        if self.unknown_models:
            out.append(f"GPU models not in the normalisation table: {', '.join(sorted(self.unknown_models))} "
                       "(priced only by an [[instance]] line or an [aliases] entry; docs/RATE_CARDS.md)")  # fmt: skip
        if self.unpriced:
            out.append(f"no rate for {', '.join(sorted(self.unpriced))}: "
                       f"{hours(total.unpriced_uh):,.2f} GPU-h in no cost")  # fmt: skip
        if total.unobserved_uh:
            out.append(f"{hours(total.unobserved_uh):,.2f} GPU-h of the fleet were not observed (no agent running "
                       "on their host): priced in the fleet cost, their state unknown")  # fmt: skip
        return out


def _host_on(gpu: FleetGpu, stays: Sequence[Any], t_ms: int) -> str:
    """The host a GPU was on at ``t_ms`` by its stays: the latest stay begun by then, else its first."""
    if not stays:
        return gpu.host
    starts = [ms(s.first_seen) for s in stays]
    i = bisect.bisect_right(starts, t_ms) - 1
    return str(stays[max(0, i)].host)


def _key(by: Sequence[str], host: str, model: str, pool: str, uuid: str) -> tuple[Any, ...]:
    values = {"host": host, "gpu_model": model, "pool": pool, "gpu": uuid}
    return tuple(values[k] for k in by)


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
        "weight": _ratio(weight, whole),
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
