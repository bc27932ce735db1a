"""Priced pieces of GPU use as FOCUS 1.0 cost-and-usage rows (docs/FOCUS.md). Pure: no I/O.

One row per UTC day, run (attempt), GPU model, instance type and rate card line: the granularity
of the daily cloud bills FOCUS datasets usually hold, so the GPU bill lines up with them day by
day. A line that also bills facility energy adds a second row for that day (``x_CostKind``
"energy") priced per kWh, so that on every row ListUnitPrice x PricingQuantity = ListCost exactly.
Sums stay integers until a row is made, so the rows add up exactly to the chargeback of the same
window (same pieces, same integers: cost.py). Hours nobody can price (no rate card line) have no
price to state and are left out, with a note.
"""

from __future__ import annotations

import bisect
import datetime as dt
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from gpuledger.core.chargeback.focus_columns import COLUMNS
from gpuledger.core.money import EXACT, PRICE_PLACES, money_decimal, tidy
from gpuledger.core.months import month_bounds, month_of
from gpuledger.core.pricing.cost import Compact
from gpuledger.core.pricing.ratecard import RateCard, RateLine

__all__ = [
    "DAY_S",
    "FocusExport",
    "FocusIdentity",
    "PricePeriods",
    "base_row",
    "build_focus",
    "gpu_hours",
    "money",
    "price_id",
    "price_model",
    "scaled",
    "slug",
    "utc",
]

DAY_S = 86400
GPU_TIME, ENERGY = "GPU time", "energy"
REPLAYED = "replayed"  # x_Flags of every row of a run metered from a replayed GPU trace
_HOUR_PLACES, _A100_PLACES, _KWH_PLACES = 6, 10, 9  # the ledger's integer units (cost.py)


class RunLike(Protocol):
    id: str
    logical_id: str
    status: str
    user: str
    team: str | None
    project: str | None
    name: str | None


@dataclass(frozen=True)
class FocusIdentity:
    """Who provides the GPU time: ProviderName, PublisherName, InvoiceIssuerName and the billing
    account. Inside one organisation these are all the team that runs the cluster."""

    provider: str

    @property
    def account_id(self) -> str:
        return slug(self.provider)


@dataclass
class FocusExport:
    """The rows (column name -> value: str, Decimal, datetime or None, in ``COLUMNS`` order) and
    what the reader should know (unpriced hours left out)."""

    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    currency: str = ""
    basis: str = ""


def base_row(identity: FocusIdentity, card: RateCard, basis: str) -> dict[str, Any]:
    """Every column null, but those all rows of one export share."""
    row: dict[str, Any] = {c.name: None for c in COLUMNS}
    row.update(
        BillingAccountId=identity.account_id,
        BillingAccountName=identity.provider,
        BillingCurrency=card.currency,
        ChargeFrequency="Usage-Based",
        InvoiceIssuerName=identity.provider,
        ProviderName=identity.provider,
        PublisherName=identity.provider,
        ServiceCategory="Compute",
        x_BillingBasis=basis,
    )
    return row


def slug(text: str) -> str:
    """'Vision cluster, 2026' -> 'vision-cluster-2026' (an identifier made of a display name)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpuledger"


def build_focus(
    items: Iterable[Compact],
    runs: Mapping[str, RunLike],
    labels: Mapping[str, Mapping[str, str]],
    *,
    card: RateCard,
    basis: str,
    start: float,
    end: float,
    identity: FocusIdentity,
) -> FocusExport:
    """FOCUS rows of the priced pieces ``items`` (cost.Pricer output, inside [start, end)).
    ``runs``: run id -> the run's facts; ``labels``: run id -> all its labels (Tags)."""
    # One cell per day, run, model, instance type and span of that day at one price: the row's
    # charge period is the span, so rows of one day never overlap and come in time order.
    periods = PricePeriods(card)
    cells: dict[tuple[int, str, str, str, float], list[int]] = {}
    flags_of: dict[tuple[int, str, str, str, float], set[str]] = {}
    spans: dict[tuple[int, str, str, str, float], tuple[float, float, RateLine | None]] = {}
    for run_id, model, instance, _month, t0, v, flags in items:
        # Pieces are cut at every price change (cost.Pricer), so each lies in one span.
        span = periods.at(model, instance, t0)
        key = (int(t0 // DAY_S), run_id, model, instance or "", span[0])
        acc = cells.get(key)
        if acc is None:
            cells[key] = list(v)
            spans[key] = span
        else:
            for i, x in enumerate(v):
                acc[i] += x
        if flags:
            flags_of.setdefault(key, set()).update(flags)
    maker = _RowMaker(runs, labels, card, basis, start, end, identity)
    rows: list[dict[str, Any]] = []
    unpriced: dict[str, int] = {}
    for key in sorted(cells):
        _day, run_id, model, instance_key, _ = key
        v, (lo, hi, line) = cells[key], spans[key]
        if line is None:
            unpriced[model] = unpriced.get(model, 0) + v[8]
            continue
        instance, period = instance_key or None, (lo, hi)  # '' in the key only: it sorts
        flags = flags_of.get(key, set())
        rows.append(maker.gpu_row(period, run_id, model, instance, line, v, flags))
        if v[4] and line.energy_price is not None:
            rows.append(maker.energy_row(period, run_id, model, instance, line, v))
    notes = [
        f"{gpu_hours(uh)} GPU-hours of {model} have no rate in the rate card: "
        "not in the FOCUS rows (the chargeback lists them as unpriced_gpu_h)"
        for model, uh in sorted(unpriced.items())
        if uh
    ]
    return FocusExport(rows, notes, card.currency, basis)


class PricePeriods:
    """The span of a UTC day at one price that holds time ``t``, by GPU model and instance type: a
    FOCUS row's charge period (a price that starts or ends inside a day splits it)."""

    def __init__(self, card: RateCard) -> None:
        self._card = card
        self._days: dict[tuple[str | None, str | None, int], tuple[list[float], list[Any]]] = {}

    def at(self, model: str | None, instance: str | None, t: float) -> tuple[float, float, RateLine | None]:
        day = int(t // DAY_S)
        found = self._days.get((model, instance, day))
        if found is None:
            spans = self._card.periods(model, instance, day * DAY_S, (day + 1) * DAY_S)
            found = self._days[(model, instance, day)] = ([a for a, _, _ in spans], spans)
        starts, spans = found
        return spans[max(0, bisect.bisect_right(starts, t) - 1)]


def scaled(units: int, places: int) -> Decimal:
    """``units`` x 10^-places, exactly, without trailing zeros (and never in exponent notation)."""
    value = Decimal(units).scaleb(-places, EXACT).normalize(EXACT)
    return value.quantize(Decimal(1)) if value == value.to_integral_value() else value


def gpu_hours(uh: int) -> Decimal:
    return scaled(uh, _HOUR_PLACES)


def money(units: int) -> Decimal:
    """Money units (10^-21) as an exact Decimal with at least two places."""
    return tidy(money_decimal(units))


def utc(t: float) -> dt.datetime:
    """A FOCUS date/time: UTC, to the second (window edges given with fractions are floored)."""
    return dt.datetime.fromtimestamp(int(t // 1), tz=dt.timezone.utc)


class _RowMaker:
    """The columns every row of one export shares, and the two kinds of row."""

    def __init__(
        self,
        runs: Mapping[str, RunLike],
        labels: Mapping[str, Mapping[str, str]],
        card: RateCard,
        basis: str,
        start: float,
        end: float,
        identity: FocusIdentity,
    ) -> None:
        self.runs, self.labels, self.card, self.basis = runs, labels, card, basis
        self.start, self.end = start, end
        self.fixed = {
            **base_row(identity, card, basis),
            "ChargeCategory": "Usage",
            "PricingCategory": "Standard",
            "ResourceType": "GPU Workload",
        }

    def _common(
        self, period: tuple[float, float], run_id: str, model: str, instance: str | None, line: RateLine
    ) -> dict[str, Any]:
        run = self.runs.get(run_id)
        tags = dict(self.labels.get(run_id, {}))
        # A replayed GPU trace's run is in a dataset only when asked for (--include-replayed): marked.
        replayed = bool(getattr(run, "replayed", False))
        lo, hi = max(period[0], self.start), min(period[1], self.end)
        month_start, month_end = month_bounds(month_of(lo))
        row = dict(self.fixed)
        row.update(
            BillingPeriodStart=utc(month_start),
            BillingPeriodEnd=utc(month_end),
            ChargePeriodStart=utc(lo),
            ChargePeriodEnd=utc(hi),
            ResourceId=run_id,
            ResourceName=(run.name if run is not None and run.name else run_id),
            Tags=json.dumps(tags, sort_keys=True, ensure_ascii=False) if tags else None,
            x_LogicalRunId=run.logical_id if run is not None and run.logical_id else run_id,
            x_RunStatus=run.status if run is not None else None,
            x_User=run.user if run is not None else None,
            x_Team=tags.get("team") or (run.team if run is not None else None),
            x_Project=tags.get("project") or (run.project if run is not None else None),
            x_ModelVersion=tags.get("model_version"),
            x_GpuModel=model,
            x_InstanceType=instance,
            x_PriceModel=price_model(line),
            x_Flags=REPLAYED if replayed else None,
        )
        return row

    def gpu_row(
        self, period: tuple[float, float], run_id: str, model: str, instance: str | None, line: RateLine,
        v: list[int], flags: set[str],
    ) -> dict[str, Any]:  # fmt: skip
        alloc, busy, unmeasured, a100eq, energy, cost, idle_cost, energy_cost, _ = v
        billed = alloc if self.basis == "allocated" else busy + unmeasured
        gpu_cost = money(cost - energy_cost)
        price = scaled(line.rate_u, PRICE_PLACES)  # the integer price the ledger's arithmetic used
        sku = f"{line.kind}:{line.key}"
        row = self._common(period, run_id, model, instance, line)
        hours = "held" if self.basis == "allocated" else "busy"
        where = f"instance {line.key}" if line.kind == "instance" else f"{model}"
        description = (
            f"{model} GPU time{f' on {instance}' if instance else ''}: {hours} GPU-hours at "
            f"{price} {self.card.currency} per GPU-hour ({price_model(line)}, {where}"
            f"{f': {line.derivation}' if line.derivation else ''})"
        )
        if row["x_Flags"]:
            flags = flags | {row["x_Flags"]}
        row.update(
            BilledCost=gpu_cost,
            ChargeDescription=description,
            ConsumedQuantity=gpu_hours(alloc),
            ConsumedUnit="GPU-Hours",
            ContractedCost=gpu_cost,
            ContractedUnitPrice=price,
            EffectiveCost=gpu_cost,
            ListCost=gpu_cost,
            ListUnitPrice=price,
            PricingQuantity=gpu_hours(billed),
            PricingUnit="GPU-Hours",
            ServiceName="GPU Compute",
            SkuId=sku,
            SkuPriceId=price_id(sku, line),
            x_CostKind=GPU_TIME,
            x_AllocatedGpuHours=gpu_hours(alloc),
            x_BusyGpuHours=gpu_hours(busy),
            x_IdleGpuHours=gpu_hours(alloc - busy - unmeasured),
            x_UnmeasuredGpuHours=gpu_hours(unmeasured),
            x_A100EquivalentHours=scaled(a100eq, _A100_PLACES),
            x_EnergyKwh=scaled(energy, _KWH_PLACES),
            x_IdleCost=money(idle_cost),
            x_Flags=";".join(sorted(flags)) or None,
        )
        return row

    def energy_row(
        self, period: tuple[float, float], run_id: str, model: str, instance: str | None, line: RateLine, v: list[int]
    ) -> dict[str, Any]:
        energy, energy_cost = v[4], v[7]
        kwh = scaled(energy, _KWH_PLACES)
        cost = money(energy_cost)
        price = scaled(line.energy_u, PRICE_PLACES)
        sku = f"energy:{line.kind}:{line.key}"
        row = self._common(period, run_id, model, instance, line)
        row.update(
            BilledCost=cost,
            ChargeDescription=(
                f"Facility energy of {model} GPUs (GPU energy x PUE {line.pue}) at {price} {self.card.currency} per kWh"
            ),
            ConsumedQuantity=kwh,
            ConsumedUnit="Kilowatt-Hours",
            ContractedCost=cost,
            ContractedUnitPrice=price,
            EffectiveCost=cost,
            ListCost=cost,
            ListUnitPrice=price,
            PricingQuantity=kwh,
            PricingUnit="Kilowatt-Hours",
            ServiceName="GPU Energy",
            SkuId=sku,
            SkuPriceId=price_id(sku, line),
            x_CostKind=ENERGY,
        )
        return row


def price_model(line: RateLine) -> str:
    if line.kind == "instance":
        return "cloud instance"
    return "on-prem amortised" if line.derivation else "per GPU-hour"


def price_id(sku: str, line: RateLine) -> str:
    """One id per price: the SKU and when its line took effect."""
    return f"{sku}@{'start' if line.start is None else utc(line.start).strftime('%Y-%m-%dT%H:%M:%SZ')}"
