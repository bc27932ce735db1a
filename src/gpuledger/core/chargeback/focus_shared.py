"""The chargeback's shared idle cost (``--share-idle``) as FOCUS rows of their own. Pure.

The fleet's cost that no run was billed for is split between the chargeback's groups by their
allocated or busy GPU-hours (reports/capacity/report.add_shared_idle). Each group's part becomes one row
for the report's window: ChargeCategory "Adjustment" — a part of a pool, not units at a price, so
it has no unit price, quantity or SKU (FOCUS 1.0 asks those of Usage and Purchase rows only) — and
the group's keys in the custom columns. With them, the rows add up to the fleet's cost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from gpuledger.core.chargeback.focus import FocusIdentity, base_row, utc
from gpuledger.core.money import tidy
from gpuledger.core.months import month_bounds, month_of
from gpuledger.core.pricing.ratecard import RateCard

__all__ = ["SHARED_IDLE", "shared_idle_rows"]

SHARED_IDLE = "shared idle"
# chargeback group key -> the custom column that carries it
_KEY_COLUMNS = {
    "team": "x_Team",
    "project": "x_Project",
    "user": "x_User",
    "gpu_model": "x_GpuModel",
    "instance_type": "x_InstanceType",
    "status": "x_RunStatus",
}


def shared_idle_rows(
    groups: Sequence[Mapping[str, Any]],
    *,
    by: Sequence[str],
    rule: str,
    fleet_cost: str,
    billed: str,
    card: RateCard,
    basis: str,
    start: float,
    end: float,
    identity: FocusIdentity,
) -> list[dict[str, Any]]:
    """One Adjustment row per chargeback group with a shared idle part (``groups``: the chargeback's
    group rows after add_shared_idle; ``fleet_cost`` and ``billed``: exact decimal strings). The
    window must lie in one calendar month: a FOCUS row belongs to one billing period."""
    if month_of(start) != month_of(end - 1e-6):
        raise ValueError(
            "the shared idle cost is one figure for the whole window, and a FOCUS row belongs to one billing "
            "period (a calendar month): give one month's window (--month) with --share-idle"
        )
    month_start, month_end = month_bounds(month_of(start))
    pool = tidy(Decimal(fleet_cost) - Decimal(billed))
    rows = []
    for group in groups:
        part = Decimal(group["shared_idle_cost"])
        if not part:
            continue
        names = ", ".join(f"{k} {group.get(k) or '(none)'}" for k in by)
        row = base_row(identity, card, basis)
        row.update(
            BilledCost=part,
            BillingPeriodStart=utc(month_start),
            BillingPeriodEnd=utc(month_end),
            ChargeCategory="Adjustment",
            ChargeDescription=(
                f"Share of the GPU fleet's cost no run was billed for ({pool:f} {card.currency}: "
                f"fleet cost {fleet_cost} - billed {billed}), split by {rule} GPU-hours: {names}"
            ),
            ChargePeriodStart=utc(start),
            ChargePeriodEnd=utc(end),
            ContractedCost=part,
            EffectiveCost=part,
            ListCost=part,
            ServiceName="GPU Fleet Idle Capacity",
            x_CostKind=SHARED_IDLE,
            x_ShareRule=rule,
        )
        for key in by:
            row[_KEY_COLUMNS[key]] = group.get(key)
        rows.append(row)
    return rows
