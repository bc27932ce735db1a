"""FOCUS 1.0's rules for a cost-and-usage dataset, written as data from the specification's text (not
from gpuledger's code), and a checker that applies them to rows read back from a CSV or Parquet file.

It covers what the FinOps Foundation's validator (focus-validator 1.0.0) does not check or checks
under pre-1.0 column names: ProviderName, PublisherName, InvoiceIssuerName and ResourceId (the
validator still requires "Provider", "Publisher", "InvoiceIssuer", "ResourceID"), SkuPriceId (its
rule reads the 0.5 column ChargeType), and the conditional rules between columns. Section names
are those of the FOCUS 1.0 specification ("Column: X" for a column's own section).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

STRING, DECIMAL, DATETIME, JSON = "String", "Decimal", "Date/Time", "JSON"


@dataclass(frozen=True)
class Col:
    type: str
    nulls: bool  # "Allows nulls" in the column's content constraints
    allowed: frozenset[str] | None = None  # "Allowed values", when the column has a closed list


def _values(*values: str) -> frozenset[str]:
    return frozenset(values)


SERVICE_CATEGORIES = _values(
    "AI and Machine Learning", "Analytics", "Business Applications", "Compute", "Databases", "Developer Tools",
    "Multicloud", "Identity", "Integration", "Internet of Things", "Management and Governance", "Media",
    "Migration", "Mobile", "Networking", "Security", "Storage", "Web", "Other",
)  # fmt: skip

# FOCUS 1.0, Columns: the 43 columns, each with its data type, "Allows nulls" and allowed values.
COLUMNS: dict[str, Col] = {
    "AvailabilityZone": Col(STRING, True),
    "BilledCost": Col(DECIMAL, False),
    "BillingAccountId": Col(STRING, False),
    "BillingAccountName": Col(STRING, True),
    "BillingCurrency": Col(STRING, False),
    "BillingPeriodEnd": Col(DATETIME, False),
    "BillingPeriodStart": Col(DATETIME, False),
    "ChargeCategory": Col(STRING, False, _values("Usage", "Purchase", "Tax", "Credit", "Adjustment")),
    "ChargeClass": Col(STRING, True, _values("Correction")),
    "ChargeDescription": Col(STRING, True),
    "ChargeFrequency": Col(STRING, False, _values("One-Time", "Recurring", "Usage-Based")),
    "ChargePeriodEnd": Col(DATETIME, False),
    "ChargePeriodStart": Col(DATETIME, False),
    "CommitmentDiscountCategory": Col(STRING, True, _values("Spend", "Usage")),
    "CommitmentDiscountId": Col(STRING, True),
    "CommitmentDiscountName": Col(STRING, True),
    "CommitmentDiscountStatus": Col(STRING, True, _values("Used", "Unused")),
    "CommitmentDiscountType": Col(STRING, True),
    "ConsumedQuantity": Col(DECIMAL, True),
    "ConsumedUnit": Col(STRING, True),
    "ContractedCost": Col(DECIMAL, False),
    "ContractedUnitPrice": Col(DECIMAL, True),
    "EffectiveCost": Col(DECIMAL, False),
    "InvoiceIssuerName": Col(STRING, False),
    "ListCost": Col(DECIMAL, False),
    "ListUnitPrice": Col(DECIMAL, True),
    "PricingCategory": Col(STRING, True, _values("Standard", "Dynamic", "Committed", "Other")),
    "PricingQuantity": Col(DECIMAL, True),
    "PricingUnit": Col(STRING, True),
    "ProviderName": Col(STRING, False),
    "PublisherName": Col(STRING, False),
    "RegionId": Col(STRING, True),
    "RegionName": Col(STRING, True),
    "ResourceId": Col(STRING, True),
    "ResourceName": Col(STRING, True),
    "ResourceType": Col(STRING, True),
    "ServiceCategory": Col(STRING, False, SERVICE_CATEGORIES),
    "ServiceName": Col(STRING, False),
    "SkuId": Col(STRING, True),
    "SkuPriceId": Col(STRING, True),
    "SubAccountId": Col(STRING, True),
    "SubAccountName": Col(STRING, True),
    "Tags": Col(JSON, True),
}

# Attribute: Date/Time Format ("YYYY-MM-DDTHH:mm:ssZ": UTC, both parts, two-digit fields, "Z").
DATETIME_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
# Attribute: Numeric Format (integer or decimal; no exponent, no "+", no commas, no symbols).
NUMERIC_TEXT = re.compile(r"-?\d+(\.\d+)?")
# Attribute: Currency Format (ISO 4217 three-letter code).
CURRENCY_TEXT = re.compile(r"[A-Z]{3}")
# Attribute: Column Naming and Ordering (custom columns: a consistent "x_" prefix, then the FOCUS
# naming rules: Pascal case, alphanumeric).
CUSTOM_NAME = re.compile(r"x_[A-Z][A-Za-z0-9]*")


def violations(columns: list[str], rows: list[dict[str, Any]], *, from_csv: bool) -> list[str]:
    """Every rule broken, as "rule: detail" lines (empty: the dataset conforms). ``rows`` hold the
    file's values: text from a CSV (empty = null), typed values from Parquet."""
    out: list[str] = []
    missing = [c for c in COLUMNS if c not in columns]
    if missing:  # every 1.0 column gpuledger can fill is written, the conditional ones too
        out.append(f"Columns: missing {missing}")
    custom = [c for c in columns if c not in COLUMNS]
    out += [f"Column Naming and Ordering: custom column {c!r} is not x_PascalCase" for c in custom
            if not CUSTOM_NAME.fullmatch(c)]  # fmt: skip
    if custom and columns.index(custom[0]) < max(columns.index(c) for c in COLUMNS if c in columns):
        out.append("Column Naming and Ordering: custom columns SHOULD follow all FOCUS columns")
    price_ids: dict[str, set[str]] = {}
    for n, row in enumerate(rows, start=2 if from_csv else 0):
        values = {name: _value(row.get(name), from_csv) for name in COLUMNS}
        out += [f"row {n}: {v}" for v in _row_violations(values, row, from_csv)]
        if values["SkuPriceId"] is not None:
            price_ids.setdefault(values["SkuPriceId"], set()).add(values["SkuId"])
    # Column: SkuPriceId — a given SkuPriceId is associated with one and only one SkuId.
    out += [f"Column: SkuPriceId {pid!r} has several SkuIds {sorted(map(str, skus))}"
            for pid, skus in price_ids.items() if len(skus) > 1]  # fmt: skip
    return out


def _value(raw: Any, from_csv: bool) -> Any:
    if from_csv and raw == "":
        return None
    return raw


def _row_violations(v: dict[str, Any], raw: dict[str, Any], from_csv: bool) -> list[str]:
    out = []
    for name, col in COLUMNS.items():
        value = v[name]
        if value is None:
            if not col.nulls:
                out.append(f"Column: {name} MUST NOT be null")
            continue
        if col.allowed is not None and value not in col.allowed:
            out.append(f"Column: {name} {value!r} is not an allowed value")
        out += _type_violations(name, col, value, from_csv)
    usage = v["ChargeCategory"] == "Usage" and v["ChargeClass"] is None
    priced = v["ChargeCategory"] in ("Usage", "Purchase") and v["ChargeClass"] is None
    # Columns PricingQuantity, ListUnitPrice, ContractedUnitPrice, SkuPriceId, PricingCategory:
    # not null when ChargeClass is not "Correction" and ChargeCategory is "Usage" or "Purchase".
    for name in ("PricingQuantity", "ListUnitPrice", "ContractedUnitPrice", "SkuPriceId", "PricingCategory"):
        if priced and v[name] is None:
            out.append(f"Column: {name} MUST NOT be null on a {v['ChargeCategory']} row")
    # Column: PricingUnit — null exactly when PricingQuantity is null.
    if (v["PricingUnit"] is None) != (v["PricingQuantity"] is None):
        out.append("Column: PricingUnit MUST be null exactly when PricingQuantity is null")
    # Columns ConsumedQuantity, ConsumedUnit — not null on Usage rows (not corrections), null otherwise.
    for name in ("ConsumedQuantity", "ConsumedUnit"):
        if usage and v[name] is None:
            out.append(f"Column: {name} MUST NOT be null on a Usage row")
        if v["ChargeCategory"] != "Usage" and v[name] is not None:
            out.append(f"Column: {name} MUST be null unless ChargeCategory is Usage")
    # Columns ListCost, ContractedCost — unit price x PricingQuantity (not for corrections).
    for cost, price in (("ListCost", "ListUnitPrice"), ("ContractedCost", "ContractedUnitPrice")):
        known = v["ChargeClass"] is None and v[price] is not None and v["PricingQuantity"] is not None
        if known and Decimal(str(v[price])) * Decimal(str(v["PricingQuantity"])) != Decimal(str(v[cost])):
            out.append(f"Column: {cost} MUST be {price} x PricingQuantity")
    # Charge and billing periods: the start is inclusive, the end exclusive.
    for period in ("ChargePeriod", "BillingPeriod"):
        start, end = v[f"{period}Start"], v[f"{period}End"]
        # ISO text in one fixed format sorts like the times it names; timestamps compare as they are.
        if start is not None and end is not None and not start < end:
            out.append(f"Column: {period}End MUST be after {period}Start")
    return out


def _type_violations(name: str, col: Col, value: Any, from_csv: bool) -> list[str]:
    if col.type == DECIMAL:
        text = value if from_csv else format(value, "f") if isinstance(value, Decimal) else None
        if text is None or not NUMERIC_TEXT.fullmatch(text):
            return [f"Attribute: Numeric Format — {name} {value!r} (type {type(value).__name__})"]
    elif col.type == DATETIME:
        if from_csv and not DATETIME_TEXT.fullmatch(value):
            return [f"Attribute: Date/Time Format — {name} {value!r}"]
        if not from_csv and (getattr(value, "tzinfo", None) is None or value.utcoffset().total_seconds() != 0):
            return [f"Attribute: Date/Time Format — {name} {value!r} is not a UTC timestamp"]
    elif col.type == JSON:
        try:
            parsed = json.loads(value)
        except (TypeError, ValueError):
            parsed = None
        if not isinstance(parsed, dict):
            return [f"Attribute: Key-Value Format — {name} {value!r} is not a JSON object"]
    elif not isinstance(value, str):
        return [f"Column: {name} MUST be of type String, not {type(value).__name__}"]
    elif name == "BillingCurrency" and not CURRENCY_TEXT.fullmatch(value):
        return [f"Attribute: Currency Format — {value!r}"]
    return []
