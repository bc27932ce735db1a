"""The exact sums of one group of the capacity report (core/capacity/report.py): hours in µh,
energy in 10^-9 kWh, money in 10^-21 units, and the documented columns they become. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuledger.core.chargeback.totals import hours
from gpuledger.core.money import money_str

__all__ = ["CapacityTotals", "ratio"]

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
        """The documented columns (core/capacity/columns.COLUMNS["groups"])."""
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
            "allocated_share": ratio(self.alloc_idle_uh + self.busy_attr_uh, observed),
            "busy_share": ratio(self.busy_attr_uh + self.busy_unattr_uh, observed),
            "observed_share": ratio(observed, self.fleet_uh),
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
            "share": ratio(self.fleet_cost, whole.fleet_cost),
        }


_SUMMED = (
    "unallocated_uh", "alloc_idle_uh", "busy_attr_uh", "busy_unattr_uh", "unobserved_uh", "unmeasured_uh",
    "unpriced_uh", "energy", "unallocated_cost", "alloc_idle_cost", "busy_attr_cost", "busy_unattr_cost",
    "unobserved_cost", "energy_cost",
)  # fmt: skip


def ratio(part: int, whole: int) -> float | None:
    return None if whole <= 0 else round(part / whole, 6)
