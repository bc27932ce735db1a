"""FOCUS 1.3's rules for the columns it adds to what gpuledger writes, as data from the specification's
text (the FinOps Foundation's FOCUS_Spec, ``specification/datasets/cost_and_usage/columns/*.md``
and the attribute sections they cite), not from gpuledger's code, and a checker for rows read back
from a CSV or Parquet file. FOCUS 1.0's rules for the columns 1.3 keeps are focus_spec_rules.py's.

* ServiceProviderName: Mandatory, String, MUST NOT be null (introduced in 1.3, replacing ProviderName).
* HostProviderName: Mandatory, String; the provider's name, or "Not Applicable".
* AllocatedMethodId: Conditional, String; MUST be null when a charge is not related to a split cost
  allocation, MUST NOT be null when it is.
* AllocatedMethodDetails: Recommended, JSON object; null when not related to a split cost allocation;
  else an object with top-level key ``Elements``, an array of one or more objects with
  ``AllocatedRatio`` (Numeric, required), ``UsageUnit`` (String, required when ``UsageQuantity`` is
  given), ``UsageQuantity`` (Numeric, optional); custom keys only as ``x_`` followed by PascalCase, at
  the top level or in an element. The AllocatedRatio of all allocated charges of one origin charge
  add up to 1 (100 %).
* AllocatedResourceId: Conditional, String; null when not related to a split cost allocation, not
  null for an allocated portion.
* AllocatedResourceName: Conditional, String; null exactly when AllocatedResourceId is null.
* AllocatedTags: Conditional, JSON object in Key-Value Format (string keys; values string, number,
  boolean); null when not related to a split cost allocation; no tag already in Tags.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

NEW_COLUMNS = (
    "AllocatedMethodDetails", "AllocatedMethodId", "AllocatedResourceId", "AllocatedResourceName", "AllocatedTags",
    "HostProviderName", "ServiceProviderName",
)  # fmt: skip
ALLOCATION = ("AllocatedMethodDetails", "AllocatedMethodId", "AllocatedResourceId", "AllocatedResourceName",
              "AllocatedTags")  # fmt: skip
_CUSTOM_KEY = re.compile(r"x_[A-Z][A-Za-z0-9]*")
_ELEMENT_KEYS = {"AllocatedRatio", "UsageUnit", "UsageQuantity"}


def _null(value: Any) -> bool:
    return value is None or value == ""


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float, Decimal)) and not isinstance(value, bool)


def split_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if not _null(r.get("AllocatedMethodId"))]


def ratios(row: dict[str, Any]) -> list[Decimal]:
    """The row's AllocatedRatio values, read as exact decimals (JSON numbers)."""
    details = json.loads(row["AllocatedMethodDetails"], parse_float=Decimal, parse_int=Decimal)
    return [e["AllocatedRatio"] for e in details["Elements"]]


def violations13(columns: list[str], rows: list[dict[str, Any]], *, split: bool) -> list[str]:
    """Every rule above broken by ``rows``. ``split``: whether the rows hold a split cost allocation
    (then the columns of a Conditional feature must be present)."""
    out = [f"missing column {c}" for c in ("ServiceProviderName", "HostProviderName") if c not in columns]
    if split:
        out += [f"missing column {c}" for c in ALLOCATION if c not in columns and c != "AllocatedMethodDetails"]
    total = Decimal(0)
    for i, row in enumerate(rows):
        where = f"row {i}"
        if _null(row.get("ServiceProviderName")):
            out.append(f"{where}: ServiceProviderName is null")
        if "HostProviderName" in columns and _null(row.get("HostProviderName")):
            out.append(f"{where}: HostProviderName is null")
        related = not _null(row.get("AllocatedMethodId"))
        if not related:
            out += [f"{where}: {c} not null on a charge with no split" for c in ALLOCATION if not _null(row.get(c))]
            continue
        if _null(row.get("AllocatedResourceId")):
            out.append(f"{where}: AllocatedResourceId null on an allocated portion")
        if _null(row.get("AllocatedResourceId")) != _null(row.get("AllocatedResourceName")):
            out.append(f"{where}: AllocatedResourceName null unlike AllocatedResourceId")
        out += [f"{where}: {e}" for e in _details_violations(row.get("AllocatedMethodDetails"))]
        out += [f"{where}: {e}" for e in _tags_violations(row.get("AllocatedTags"), row.get("Tags"))]
        if not _null(row.get("AllocatedMethodDetails")):
            total += sum(ratios(row), Decimal(0))
    if split_rows(rows) and total != 1:
        out.append(f"the AllocatedRatio of the split's allocated charges add up to {total}, not 1")
    return out


def _details_violations(text: Any) -> list[str]:
    if _null(text):
        return []  # Recommended: SHOULD NOT be null, not MUST
    try:
        obj = json.loads(text, parse_float=Decimal, parse_int=Decimal)
    except (TypeError, ValueError):
        return ["AllocatedMethodDetails is not JSON"]
    if not isinstance(obj, dict):
        return ["AllocatedMethodDetails is not a JSON object"]
    out = [f"AllocatedMethodDetails key {k!r} is neither FOCUS's nor x_PascalCase"
           for k in obj if k != "Elements" and not _CUSTOM_KEY.fullmatch(k)]  # fmt: skip
    elements = obj.get("Elements")
    if not isinstance(elements, list) or not elements:
        return [*out, "AllocatedMethodDetails.Elements is not a non-empty array"]
    for e in elements:
        if not isinstance(e, dict):
            out.append("an Elements entry is not an object")
            continue
        if not _numeric(e.get("AllocatedRatio")):
            out.append("AllocatedRatio missing or not numeric")
        if "UsageQuantity" in e and not _numeric(e["UsageQuantity"]):
            out.append("UsageQuantity not numeric")
        if "UsageQuantity" in e and not isinstance(e.get("UsageUnit"), str):
            out.append("UsageQuantity given without a UsageUnit string")
        out += [f"Elements key {k!r} is neither FOCUS's nor x_PascalCase"
                for k in e if k not in _ELEMENT_KEYS and not _CUSTOM_KEY.fullmatch(k)]  # fmt: skip
    return out


def _tags_violations(text: Any, tags: Any) -> list[str]:
    if _null(text):
        return []
    try:
        obj = json.loads(text)
    except (TypeError, ValueError):
        return ["AllocatedTags is not JSON"]
    if not isinstance(obj, dict):
        return ["AllocatedTags is not a JSON object"]
    out = [f"AllocatedTags value of {k!r} is not a string, number or boolean"
           for k, v in obj.items() if not isinstance(v, (str, int, float, bool))]  # fmt: skip
    resource_tags = {} if _null(tags) else json.loads(tags)
    out += [f"AllocatedTags repeats the resource tag {k!r}" for k in obj if k in resource_tags]
    return out
