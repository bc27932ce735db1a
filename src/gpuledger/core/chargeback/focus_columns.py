"""The columns of gpuledger's FOCUS export: the FinOps Foundation's FOCUS 1.0 cost-and-usage columns,
then gpuledger's own, ``x_``-prefixed as FOCUS requires of custom columns. docs/FOCUS.md lists them
in this order and a test checks the two agree.

Kinds: ``string``; ``datetime`` (ISO 8601 UTC, to the second); ``json`` (a JSON object as text);
``decimal`` with the number of places that holds every value exactly (``places``), so money and
quantities keep the ledger's exact integers (CSV: plain decimal strings, Parquet: decimal128).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuledger.core.money import MONEY_SCALE, PRICE_PLACES

__all__ = ["COLUMNS", "CUSTOM_COLUMNS", "FOCUS_COLUMNS", "FOCUS_VERSION", "FocusColumn"]

FOCUS_VERSION = "1.0"  # the newest version the FinOps Foundation's validator (focus-validator 1.0.0) checks

HOUR_PLACES = 6  # GPU-hours are integer micro-GPU-hours (money.UH_PER_H)
A100_PLACES = 10  # A100-equivalent hours: 10^-10 h (chargeback_totals.A100_SCALE)
KWH_PLACES = 9  # facility energy: 10^-9 kWh
QUANTITY_PLACES = max(HOUR_PLACES, KWH_PLACES)  # PricingQuantity holds GPU-hours or kWh


@dataclass(frozen=True)
class FocusColumn:
    name: str
    kind: str  # string, datetime, json, decimal
    meaning: str
    unit: str = ""  # custom columns: GPU-h, A100-h, kWh, currency
    places: int = 0  # decimal places of a decimal column


def _money(name: str, meaning: str) -> FocusColumn:
    return FocusColumn(name, "decimal", meaning, "currency", MONEY_SCALE)


FOCUS_COLUMNS: tuple[FocusColumn, ...] = (
    FocusColumn("AvailabilityZone", "string", "null: gpuledger does not know zones"),
    _money("BilledCost", "the charge back to the run's owners: hours on the billing basis x rate (or kWh x price)"),
    FocusColumn("BillingAccountId", "string", "the provider name as a slug (--provider)"),
    FocusColumn("BillingAccountName", "string", "the provider name (--provider; default: the rate card's name)"),
    FocusColumn("BillingCurrency", "string", "the rate card's currency (ISO 4217)"),
    FocusColumn("BillingPeriodEnd", "datetime", "exclusive end of the charge's calendar month (UTC)"),
    FocusColumn("BillingPeriodStart", "datetime", "first instant of the charge's calendar month (UTC)"),
    FocusColumn("ChargeCategory", "string", "Usage; Adjustment for a share of the fleet's unbilled cost"),
    FocusColumn("ChargeClass", "string", "null: no row corrects an earlier billing period"),
    FocusColumn("ChargeDescription", "string", "what was priced, at which rate, from which rate card line"),
    FocusColumn("ChargeFrequency", "string", "Usage-Based"),
    FocusColumn("ChargePeriodEnd", "datetime", "exclusive end: the next UTC midnight, or the window's or price's end"),
    FocusColumn("ChargePeriodStart", "datetime", "UTC midnight of the day, or the window's or price's start"),
    FocusColumn("CommitmentDiscountCategory", "string", "null: a rate card has no commitment discounts"),
    FocusColumn("CommitmentDiscountId", "string", "null"),
    FocusColumn("CommitmentDiscountName", "string", "null"),
    FocusColumn("CommitmentDiscountStatus", "string", "null"),
    FocusColumn("CommitmentDiscountType", "string", "null"),
    FocusColumn("ConsumedQuantity", "decimal", "GPU-hours held (GPU time rows) or facility kWh", "", QUANTITY_PLACES),
    FocusColumn("ConsumedUnit", "string", "GPU-Hours or Kilowatt-Hours"),
    _money("ContractedCost", "= ListCost (a rate card price is the agreed price)"),
    FocusColumn("ContractedUnitPrice", "decimal", "= ListUnitPrice", "", PRICE_PLACES),
    _money("EffectiveCost", "= BilledCost (on-prem rates are already amortised)"),
    FocusColumn("InvoiceIssuerName", "string", "the provider name"),
    _money("ListCost", "ListUnitPrice x PricingQuantity"),
    FocusColumn("ListUnitPrice", "decimal", "the rate card's price per GPU-hour or per kWh", "", PRICE_PLACES),
    FocusColumn("PricingCategory", "string", "Standard"),
    FocusColumn("PricingQuantity", "decimal", "GPU-hours on the billing basis, or facility kWh", "", QUANTITY_PLACES),
    FocusColumn("PricingUnit", "string", "GPU-Hours or Kilowatt-Hours"),
    FocusColumn("ProviderName", "string", "the provider name"),
    FocusColumn("PublisherName", "string", "the provider name"),
    FocusColumn("RegionId", "string", "null: gpuledger does not know regions"),
    FocusColumn("RegionName", "string", "null"),
    FocusColumn("ResourceId", "string", "the run (attempt) id"),
    FocusColumn("ResourceName", "string", "the run's name (its id when it has none)"),
    FocusColumn("ResourceType", "string", "GPU Workload"),
    FocusColumn("ServiceCategory", "string", "Compute"),
    FocusColumn("ServiceName", "string", "GPU Compute or GPU Energy"),
    FocusColumn("SkuId", "string", "the rate card line's key: gpu:MODEL or instance:TYPE (energy:... for energy)"),
    FocusColumn("SkuPriceId", "string", "SkuId@the line's effective_from (start when open)"),
    FocusColumn("SubAccountId", "string", "null: runs are grouped by labels (Tags), not sub accounts"),
    FocusColumn("SubAccountName", "string", "null"),
    FocusColumn("Tags", "json", "the run's labels as a JSON object (null when it has none)"),
)

CUSTOM_COLUMNS: tuple[FocusColumn, ...] = (
    FocusColumn("x_CostKind", "string", "GPU time, energy, shared idle or capacity", "text"),
    FocusColumn("x_LogicalRunId", "string", "the logical run: the first attempt of a resumed training", "text"),
    FocusColumn("x_RunStatus", "string", "the run's status (killed, lost, failed, running: partial)", "text"),
    FocusColumn("x_User", "string", "who ran it", "text"),
    FocusColumn("x_Team", "string", "label team", "text"),
    FocusColumn("x_Project", "string", "label project", "text"),
    FocusColumn("x_ModelVersion", "string", "label model_version", "text"),
    FocusColumn("x_GpuModel", "string", "normalisation-table key (or the device name when unknown)", "text"),
    FocusColumn("x_InstanceType", "string", "cloud instance type used for the price", "text"),
    FocusColumn("x_Host", "string", "capacity rows: the host the GPU was on", "text"),
    FocusColumn("x_Pool", "string", "capacity rows: the host's pool (the pools file)", "text"),
    FocusColumn("x_CapacityState", "string", "capacity rows: the GPU-hours' state (docs/FOCUS.md)", "text"),
    FocusColumn("x_BillingBasis", "string", "allocated or busy: which hours PricingQuantity counts", "text"),
    FocusColumn("x_PriceModel", "string", "per GPU-hour, cloud instance or on-prem amortised", "text"),
    FocusColumn("x_ShareRule", "string", "shared idle rows: allocated or busy, the hours shared by", "text"),
    FocusColumn("x_AllocatedGpuHours", "decimal", "GPU time held (wall time x GPUs)", "GPU-h", HOUR_PLACES),
    FocusColumn("x_BusyGpuHours", "decimal", "GPU time busy (the driver's utilisation samples)", "GPU-h", HOUR_PLACES),
    FocusColumn("x_IdleGpuHours", "decimal", "allocated - busy - unmeasured", "GPU-h", HOUR_PLACES),
    FocusColumn(
        "x_UnmeasuredGpuHours", "decimal", "held time of GPUs that report no utilisation", "GPU-h", HOUR_PLACES
    ),
    FocusColumn("x_A100EquivalentHours", "decimal", "busy GPU-hours x the model's factor", "A100-h", A100_PLACES),
    FocusColumn("x_EnergyKwh", "decimal", "facility energy (GPU energy x PUE), on GPU time rows", "kWh", KWH_PLACES),
    _money("x_IdleCost", "idle hours x rate (in BilledCost on the allocated basis, absorbed on the busy basis)"),
    FocusColumn("x_Flags", "string", "';'-separated: replayed, shared:RULE, mig, busy_unmeasured ...", "text"),
)

COLUMNS: tuple[FocusColumn, ...] = FOCUS_COLUMNS + CUSTOM_COLUMNS
