"""FOCUS 1.3 from gpuledger's FOCUS 1.0 rows (docs/FOCUS.md, "FOCUS 1.3"). Pure: no I/O.

FOCUS 1.3 (ratified December 2025) adds to the cost-and-usage dataset, among columns whose
conditions a GPU ledger never meets (commitments, capacity reservations, virtual currencies,
contracts):

* ``ServiceProviderName`` and ``HostProviderName`` (Mandatory; they replace the deprecated
  ``ProviderName`` and ``PublisherName``, which stay): the organisation's GPU platform provides the
  GPU time and hosts it, so both are the provider's name (``--provider``);
* the split cost allocation columns ``AllocatedMethodId``, ``AllocatedMethodDetails``,
  ``AllocatedResourceId``, ``AllocatedResourceName`` and ``AllocatedTags`` (Conditional: present when
  the data generator splits a charge). gpuledger's one split is ``--share-idle``: the fleet's cost no
  run was billed for (the *origin charge*) split between the chargeback's groups (the *allocated
  charges*) by their allocated or busy GPU-hours. In FOCUS 1.0 the rule is ``x_ShareRule``; in 1.3
  the standard columns carry it and that custom column is gone.

On every other row the five allocation columns are null, as the specification requires of a
charge not related to a split cost allocation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from typing import Any

from gpuledger.core.chargeback.focus import FocusExport
from gpuledger.core.chargeback.focus_columns import CUSTOM_COLUMNS, FOCUS_COLUMNS, FocusColumn
from gpuledger.core.money import UH_PER_H

__all__ = [
    "ALLOCATED_COLUMNS",
    "FOCUS_VERSIONS",
    "METHOD_IDS",
    "allocation_cells",
    "columns_for",
    "to_v13",
]

FOCUS_VERSIONS = ("1.0", "1.3")
RATIO_PLACES = 12  # AllocatedRatio: the last ratio takes the rounding, so the ratios add up to 1 exactly
USAGE_UNIT = "GPU-Hours"
# One AllocatedMethodId per documented method (docs/FOCUS.md, "Allocation methods").
METHOD_IDS = {"allocated": "gpuledger-shared-idle-allocated-gpu-hours", "busy": "gpuledger-shared-idle-busy-gpu-hours"}
# Chargeback group keys that are the runs' own labels (user-defined tags, keys as given); the others
# are gpuledger's facts (data generator-defined tags, under gpuledger's documented prefix).
_LABEL_KEYS = frozenset({"team", "project"})
TAG_PREFIX = "gpuledger/"

PROVIDER_COLUMNS = (
    FocusColumn("HostProviderName", "string", "the provider name: the platform hosts its GPUs itself"),
    FocusColumn("ServiceProviderName", "string", "the provider name (replaces ProviderName)"),
)
ALLOCATED_COLUMNS = (
    FocusColumn("AllocatedMethodDetails", "json", "shared idle rows: {Elements: [{AllocatedRatio, UsageUnit, ...}]}"),
    FocusColumn("AllocatedMethodId", "string", "shared idle rows: the split's documented method"),
    FocusColumn("AllocatedResourceId", "string", "shared idle rows: the group the cost is allocated to (key=value)"),
    FocusColumn("AllocatedResourceName", "string", "shared idle rows: the group's display name"),
    FocusColumn("AllocatedTags", "json", "shared idle rows: the group's keys as tags"),
)
_COLUMNS_13 = (
    tuple(sorted((*FOCUS_COLUMNS, *PROVIDER_COLUMNS, *ALLOCATED_COLUMNS), key=lambda c: c.name))
    + tuple(c for c in CUSTOM_COLUMNS if c.name != "x_ShareRule")
)  # fmt: skip


def columns_for(version: str) -> tuple[FocusColumn, ...]:
    """The columns of a dataset of FOCUS ``version``, in order (FOCUS columns A-Z, then x_ columns)."""
    if version == "1.0":
        return (*FOCUS_COLUMNS, *CUSTOM_COLUMNS)
    if version == "1.3":
        return _COLUMNS_13
    raise ValueError(f"FOCUS version {version!r}: use one of {', '.join(FOCUS_VERSIONS)}")


def allocation_cells(groups: Sequence[Mapping[str, Any]], by: Sequence[str], rule: str) -> list[dict[str, Any]]:
    """The allocation columns of each group with a shared idle part, in the groups' order (the order
    of focus_shared.shared_idle_rows' rows). ``groups``: the chargeback's groups after
    add_shared_idle (``shared_idle_cost`` exact decimal strings, hours with 6 places)."""
    shared = [g for g in groups if Decimal(g["shared_idle_cost"])]
    pool = sum((Decimal(g["shared_idle_cost"]) for g in shared), Decimal(0))
    ratios = _ratios([Fraction(Decimal(g["shared_idle_cost"])) / Fraction(pool) for g in shared]) if pool else []
    cells = []
    for group, ratio in zip(shared, ratios, strict=True):
        hours = Decimal(str(group.get("allocated_gpu_h" if rule == "allocated" else "busy_gpu_h") or 0))
        if rule == "busy":  # GPUs that report no utilisation are shared by their held hours (add_shared_idle)
            hours += Decimal(str(group.get("unmeasured_gpu_h") or 0))
        quantity = (hours * UH_PER_H).to_integral_value() / UH_PER_H
        # JSON numbers written from the decimals themselves: a float would not add up to 1.
        element = f'{{"AllocatedRatio":{ratio:f},"UsageUnit":"{USAGE_UNIT}","UsageQuantity":{quantity:f}}}'
        tags = {(k if k in _LABEL_KEYS else TAG_PREFIX + k): group.get(k) for k in by if group.get(k) is not None}
        cells.append({
            "AllocatedMethodId": METHOD_IDS[rule],
            "AllocatedMethodDetails": f'{{"Elements":[{element}],"x_ShareRule":{json.dumps(rule)}}}',
            "AllocatedResourceId": ";".join(f"{k}={group.get(k) if group.get(k) is not None else ''}" for k in by),
            "AllocatedResourceName": ", ".join(f"{k} {group.get(k) or '(none)'}" for k in by),
            "AllocatedTags": json.dumps(tags, sort_keys=True, separators=(",", ":")) if tags else None,
        })  # fmt: skip
    return cells


def _ratios(exact: Sequence[Fraction]) -> list[Decimal]:
    """Each ratio to RATIO_PLACES places, the largest taking the remainder: they add up to 1 exactly."""
    step = Decimal(1).scaleb(-RATIO_PLACES)
    out = [Decimal(f.numerator) / Decimal(f.denominator) for f in exact]
    out = [r.quantize(step, rounding=ROUND_HALF_EVEN) for r in out]
    if out:
        big = max(range(len(out)), key=lambda i: abs(out[i]))
        out[big] += Decimal(1) - sum(out, Decimal(0))
    return out


def to_v13(export: FocusExport, allocations: Sequence[Mapping[str, Any]] = ()) -> FocusExport:
    """The 1.0 ``export`` as a FOCUS 1.3 dataset. ``allocations``: allocation_cells of its shared idle
    rows (x_CostKind "shared idle"), in their order."""
    names = [c.name for c in _COLUMNS_13]
    shared = [r for r in export.rows if r.get("x_CostKind") == "shared idle"]
    if len(shared) != len(allocations):
        raise ValueError(f"{len(shared)} shared idle rows but {len(allocations)} allocations")
    split = {id(r): a for r, a in zip(shared, allocations, strict=True)}
    rows = []
    for row in export.rows:
        out = {name: row.get(name) for name in names}
        out.update(ServiceProviderName=row["ProviderName"], HostProviderName=row["ProviderName"])
        out.update(split.get(id(row), {}))
        rows.append(out)
    return FocusExport(rows, list(export.notes), export.currency, export.basis)
