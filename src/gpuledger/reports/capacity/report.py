"""Capacity use cases: the capacity report of a window, the fleet inventory, and the chargeback's
shared idle column (docs/CAPACITY.md). Reads the ledger, hands pure code (core/capacity/report.py)
what it needs. The whole fleet is always read: capacity is not divided by project.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuledger.core.capacity.fleet import fleet_rows
from gpuledger.core.capacity.model import FleetGpu
from gpuledger.core.capacity.pools import Pools, PoolsError, parse_pools
from gpuledger.core.capacity.report import CapacityReport, TeamBill, build_capacity, share_pool
from gpuledger.core.chargeback.report import Chargeback
from gpuledger.core.money import UH_PER_H, money_str
from gpuledger.core.pricing.ratecard import RateCard
from gpuledger.core.pricing.usage import day_of
from gpuledger.reports.capacity.runs import runs_fleet, runs_gpus, team_bills, whole_days
from gpuledger.reports.cost.replayed import replayed_warning
from gpuledger.store import capacity_audit
from gpuledger.store import capacity_queries as capq
from gpuledger.store.cost_queries import replayed_in_window

if TYPE_CHECKING:
    from gpuledger.store import Ledger

__all__ = ["add_shared_idle", "capacity", "fleet", "fleet_cost", "load_pools"]


def load_pools(path: str | os.PathLike[str] | None) -> Pools:
    """The pools file at ``path`` (docs/CAPACITY.md), or no pools."""
    if path is None:
        return Pools()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PoolsError([f"{path}: cannot read the pools file: {exc.strerror or exc}"]) from exc
    return parse_pools(text, os.fspath(path))


def _read(
    ledger: Ledger, card: RateCard, start: float, end: float, *, replayed: bool = False
) -> tuple[list[FleetGpu], list[Any]]:
    """The fleet (agent-seen GPUs and those known only from runs) and its day rows in [start, end).
    The GPUs of replayed traces (--replay-gpus demos) are no hardware: read only with ``replayed``."""
    if not whole_days(start, end):
        raise ValueError("the capacity ledger is kept per UTC day: give whole days (--month, or --from/--to dates)")

    def tx(conn: Any) -> tuple[list[FleetGpu], list[Any]]:
        gpus = capq.fleet(conn)
        rows = capq.day_rows(conn, day_of(start), day_of(end - 1e-6))
        derived, derived_rows = runs_fleet(conn, card, start, end, replayed=replayed)
        return gpus + derived, rows + derived_rows

    return ledger.read(tx)


def _unsealed_note(ledger: Ledger, start: float, end: float) -> tuple[str | None, str | None]:
    """(the last capacity day sealed in the audit trail, as YYYY-MM-DD, or None; a note when the
    window holds agents' day rows after it). A local ledger keeps no trail: (None, None)."""
    through, open_day = ledger.read(lambda c: capacity_audit.unsealed_in(c, day_of(start), day_of(end - 1e-6)))
    sealed = None if through is None else capacity_audit.date_of(through)
    if open_day is None:
        return sealed, None
    return sealed, (
        f"the agents' figures from {capacity_audit.date_of(open_day)} on are not sealed in the audit trail "
        "yet (a day is sealed once the day after it is over: docs/AUDIT.md)"
    )


def capacity(
    ledger: Ledger,
    *,
    card: RateCard,
    pools: Pools,
    start: float,
    end: float,
    by: tuple[str, ...] = ("host",),
    share_rule: str = "none",
    basis: str | None = None,
    include_replayed: bool = False,
) -> CapacityReport:
    """The capacity report of [start, end) (whole UTC days), grouped ``by``; with ``share_rule``
    allocated or busy, the cost no run was billed for shared back to teams (docs/CAPACITY.md).
    Replayed runs (--replay-gpus) neither make capacity nor are billed unless ``include_replayed``."""
    gpus, rows = _read(ledger, card, start, end, replayed=include_replayed)
    bills: list[TeamBill] = []
    if share_rule != "none":
        bills = ledger.read(lambda conn: team_bills(conn, card, start, end, basis, replayed=include_replayed))
    sealed_through, unsealed = _unsealed_note(ledger, start, end)
    params = {
        "basis": basis or card.basis,
        "rate_card": card.name or card.source,
        "rate_card_source": card.source,
        "pools": pools.source or None,
        "sealed_through": sealed_through,
    }
    warnings = [] if unsealed is None else [unsealed]
    params.update(_replayed_note(ledger, gpus, start, end, include_replayed, warnings))
    derived = [g for g in gpus if g.source == "runs"]
    if derived:
        warnings.append(
            f"{len(derived)} GPU(s) no node agent watches are derived from the runs recorded on them: "
            "they count from their first run to their last, held while a run held them and busy as the runs "
            "measured; GPUs no run used and work outside recorded runs are not seen (docs/CAPACITY.md)"
        )
    return build_capacity(
        gpus=gpus, day_rows=rows, card=card, pools=pools, start=start, end=end, by=by, share_rule=share_rule,
        bills=bills, params=params, warnings=warnings,
    )  # fmt: skip


def _replayed_note(
    ledger: Ledger, gpus: list[FleetGpu], start: float, end: float, included: bool, warnings: list[str]
) -> dict[str, Any]:
    """The report's replayed marks (params ``include_replayed``, ``replayed_runs``,
    ``replayed_gpus``) and a warning saying what was left out or, with ``included``, put in."""
    ids = ledger.read(lambda conn: replayed_in_window(conn, scope=None, start=start, end=end))
    gpu_ids = sorted(replayed_gpus(ledger, gpus, start, end)) if included and ids else []
    if ids:
        warnings.append(replayed_warning(ids, included))
    return {"include_replayed": included, "replayed_runs": ids if included else [], "replayed_gpus": gpu_ids}


def replayed_gpus(ledger: Ledger, gpus: list[FleetGpu], start: float, end: float) -> set[str]:
    """The GPUs of ``gpus`` known only from replayed runs (a read with ``replayed``): no hardware."""

    def tx(conn: Any) -> set[str]:
        every = {u for _, u, _, _, _ in capq.unmetered_devices(conn, 0.0, end, replayed=True)}
        real = {u for _, u, _, _, _ in capq.unmetered_devices(conn, 0.0, end, replayed=False)}
        return every - real

    return ledger.read(tx) & {g.uuid for g in gpus if g.source == "runs"}


def fleet_cost(
    ledger: Ledger, *, card: RateCard, pools: Pools, start: float, end: float, include_replayed: bool = False
) -> int:
    """The fleet's cost over [start, end) in money units (10^-21): asset cost and energy (of
    replayed traces' GPUs only with ``include_replayed``)."""
    gpus, rows = _read(ledger, card, start, end, replayed=include_replayed)
    report = build_capacity(gpus=gpus, day_rows=rows, card=card, pools=pools, start=start, end=end, by=("host",))
    return report.total_units.fleet_cost


def fleet(ledger: Ledger, *, card: RateCard, pools: Pools, now: float | None = None) -> list[dict[str, Any]]:
    """The fleet inventory: every GPU agents have seen and every GPU known only from runs (not
    those of replayed GPU traces: no hardware)."""
    now = time.time() if now is None else now

    def tx(conn: Any) -> list[FleetGpu]:
        derived, _ = runs_gpus(conn, 0.0, now)
        return capq.fleet(conn) + derived

    return fleet_rows(ledger.read(tx), card=card, pools=pools, now=now)


def add_shared_idle(cb: Chargeback, fleet_units: int, rule: str) -> Chargeback:
    """The chargeback with two more group columns: ``shared_idle_cost`` (the cost no run was billed
    for, fleet cost - the report's total cost, split by the groups' allocated or busy hours) and
    ``cost_with_shared_idle``; its TOTAL row's ``cost_with_shared_idle`` is the fleet's cost."""
    billed = cb.total_units.cost
    pool = fleet_units - billed
    weights = [_uh(row["allocated_gpu_h" if rule == "allocated" else "busy_gpu_h"]) for row in cb.groups]
    if rule == "busy":  # GPUs that report no utilisation are billed their held hours as busy
        weights = [w + _uh(row["unmeasured_gpu_h"]) for w, row in zip(weights, cb.groups, strict=True)]
    parts = share_pool(pool, weights)
    for row, part in zip(cb.groups, parts, strict=True):
        cost = _units(row["cost"])
        row["shared_idle_cost"] = money_str(part)
        row["cost_with_shared_idle"] = money_str(cost + part)
    cb.total["shared_idle_cost"] = money_str(sum(parts))
    cb.total["cost_with_shared_idle"] = money_str(billed + sum(parts))
    cb.params.update(share_idle=rule, fleet_cost=money_str(fleet_units))
    if not any(weights):
        cb.warnings.append(f"no group has {rule} hours: the fleet's unbilled cost {money_str(pool)} is not shared")
    elif pool < 0:
        cb.warnings.append(f"the runs were billed {money_str(-pool)} more than the fleet cost (docs/CAPACITY.md)")
    return cb


def _uh(value: float | None) -> int:
    """Hours as the chargeback prints them (6 places, exact µh) back to integer µh."""
    return 0 if value is None else round(value * UH_PER_H)


def _units(text: str) -> int:
    from decimal import Decimal

    from gpuledger.core.money import EXACT, MONEY_SCALE

    return int(Decimal(text).scaleb(MONEY_SCALE, EXACT))
