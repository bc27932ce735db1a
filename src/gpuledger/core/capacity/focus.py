"""The capacity report as FOCUS 1.0 rows: what the whole fleet cost, GPU by GPU, day by day, in each
state (docs/FOCUS.md). Pure: it takes the priced pieces build_capacity hands its ``on_piece``.

One row per UTC day, GPU, host, span of the day at one price, and state — unallocated, allocated
idle, busy attributed, busy unattributed, unobserved — priced at the GPU's rate card line like the
capacity report's asset cost, plus an energy row where the line bills power. The same integers as
the report's sums, so the rows add up to its fleet cost exactly. These rows are the provider's side
(what the capacity cost); the chargeback's rows are the consumers' side (who was billed): a finance
tool should load one or the other for a month, not both.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuledger.core.capacity.model import FleetGpu
from gpuledger.core.chargeback.focus import (
    FocusExport,
    FocusIdentity,
    PricePeriods,
    base_row,
    gpu_hours,
    money,
    price_id,
    price_model,
    scaled,
    utc,
)
from gpuledger.core.money import PRICE_PLACES, gpu_money
from gpuledger.core.months import month_bounds, month_of
from gpuledger.core.pricing.ratecard import RateCard, RateLine

__all__ = ["CAPACITY", "STATE_NAMES", "capacity_rows"]

CAPACITY = "capacity"
# build_capacity's five parts, in order, as the rows name them
STATE_NAMES = ("unallocated", "allocated idle", "busy attributed", "busy unattributed", "unobserved")


def capacity_rows(
    pieces: Iterable[tuple[Any, ...]],
    fleet: Mapping[str, FleetGpu],
    *,
    card: RateCard,
    start: float,
    end: float,
    identity: FocusIdentity,
) -> FocusExport:
    """FOCUS rows of build_capacity's priced ``pieces`` (gpu uuid, host, day, pool, model, instance
    type, line, state µh x5, unmeasured µh, energy mWh, piece start) of [start, end); ``fleet``:
    uuid -> GPU."""
    # One sum per day, GPU, host and span of that day at one price: the row's charge period is the
    # span, so the rows of one GPU-day never overlap and come in time order.
    periods = PricePeriods(card)
    sums: dict[tuple[Any, ...], list[int]] = {}
    spans: dict[tuple[Any, ...], tuple[float, float, RateLine | None]] = {}
    for uuid, host, day, pool, model, instance, _line, uh, _unmeasured, mwh, t0 in pieces:
        span = periods.at(model, instance, t0)  # a piece is cut at every price change: one span
        key = (day, uuid, host, pool or "", model, instance or "", span[0])
        acc = sums.get(key)
        if acc is None:
            acc = sums[key] = [0] * 6
            spans[key] = span
        for i, x in enumerate((*uh, mwh)):
            acc[i] += x
    rows: list[dict[str, Any]] = []
    unpriced: dict[str, int] = {}
    for key in sorted(sums):
        day, uuid, host, pool, model, instance, _ = key
        v, (lo, hi, line) = sums[key], spans[key]
        if line is None:
            unpriced[model] = unpriced.get(model, 0) + sum(v[:5])
            continue
        common = _common((lo, hi), uuid, host, pool, model, instance, line, fleet.get(uuid), card, start, end,
                         identity)  # fmt: skip
        rate = scaled(line.rate_u, PRICE_PLACES)
        sku = f"{line.kind}:{line.key}"
        for state, uh in zip(STATE_NAMES, v[:5], strict=True):
            if not uh:
                continue
            cost = money(gpu_money(uh, line.rate_u))
            row = dict(common)
            row.update(
                BilledCost=cost, ContractedCost=cost, EffectiveCost=cost, ListCost=cost,
                ChargeDescription=(
                    f"{model} GPU {uuid} on {host}: {state} GPU-hours at {rate} {card.currency} per GPU-hour "
                    f"({price_model(line)}{f': {line.derivation}' if line.derivation else ''})"
                ),
                ConsumedQuantity=gpu_hours(uh), ConsumedUnit="GPU-Hours", PricingQuantity=gpu_hours(uh),
                PricingUnit="GPU-Hours", ContractedUnitPrice=rate, ListUnitPrice=rate, ServiceName="GPU Capacity",
                SkuId=sku, SkuPriceId=price_id(sku, line), x_CostKind=CAPACITY, x_CapacityState=state,
            )  # fmt: skip
            rows.append(row)
        units = v[5] * line.pue_m
        if units and line.energy_price is not None:
            cost = money(units * line.energy_u)
            price, kwh = scaled(line.energy_u, PRICE_PLACES), scaled(units, 9)
            row = dict(common)
            row.update(
                BilledCost=cost, ContractedCost=cost, EffectiveCost=cost, ListCost=cost,
                ChargeDescription=(
                    f"Facility energy of {model} GPU {uuid} on {host} (GPU energy x PUE {line.pue}) at {price} "
                    f"{card.currency} per kWh"
                ),
                ConsumedQuantity=kwh, ConsumedUnit="Kilowatt-Hours", PricingQuantity=kwh, PricingUnit="Kilowatt-Hours",
                ContractedUnitPrice=price, ListUnitPrice=price, ServiceName="GPU Energy", SkuId=f"energy:{sku}",
                SkuPriceId=price_id(f"energy:{sku}", line), x_CostKind="energy", x_EnergyKwh=None,
            )  # fmt: skip
            rows.append(row)
    notes = [
        f"{gpu_hours(uh)} GPU-hours of {model} in the fleet have no rate in the rate card: not in the FOCUS rows"
        for model, uh in sorted(unpriced.items())
        if uh
    ]
    return FocusExport(rows, notes, card.currency, "")


def _common(
    period: tuple[float, float], uuid: str, host: str, pool: str, model: str, instance: str, line: RateLine,
    gpu: FleetGpu | None, card: RateCard, start: float, end: float, identity: FocusIdentity,
) -> dict[str, Any]:  # fmt: skip
    lo, hi = max(period[0], start), min(period[1], end)
    month_start, month_end = month_bounds(month_of(lo))
    row = base_row(identity, card, "")
    row.update(
        BillingPeriodStart=utc(month_start),
        BillingPeriodEnd=utc(month_end),
        ChargeCategory="Usage",
        ChargePeriodStart=utc(lo),
        ChargePeriodEnd=utc(hi),
        PricingCategory="Standard",
        ResourceId=uuid,
        ResourceName=f"{gpu.name if gpu is not None else model} on {host}",
        ResourceType="GPU",
        x_BillingBasis=None,
        x_GpuModel=model,
        x_InstanceType=instance or None,
        x_Host=host,
        x_Pool=pool or None,
        x_PriceModel=price_model(line),
    )
    return row
