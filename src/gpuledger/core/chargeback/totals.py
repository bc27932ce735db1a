"""The sums a chargeback is made of: integer Totals of priced pieces and their documented columns.
Pure; shared by chargeback.py and chargeback_sections.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpuledger.core.money import EXACT, MONEY_SCALE, UH_PER_H, money_str
from gpuledger.core.pricing.cost import CostLine, compact
from gpuledger.core.pricing.usage import partial_flag

__all__ = ["RunInfo", "Totals", "as_set", "hours", "sort_key", "totals_of", "usage_columns"]

A100_SCALE = 10**10
_ENERGY_SCALE = 10**9
_RATIO_PLACES = 6


@dataclass(frozen=True, slots=True)
class RunInfo:
    id: str
    logical_id: str  # the first attempt of a resumed run's chain (its own id otherwise)
    status: str
    user: str
    team: str | None = None
    project: str | None = None
    name: str | None = None
    started_at: float = 0.0
    ended_at: float | None = None
    replayed: bool = False  # metered from a replayed GPU trace (--replay-gpus), not real hardware


class Totals:
    """Integer sums of priced pieces (AMOUNTS order, cost.py), plus which runs contributed."""

    __slots__ = (
        "a100eq",
        "alloc_uh",
        "busy_uh",
        "cost",
        "energy",
        "energy_cost",
        "idle_cost",
        "logical",
        "partial",
        "records",
        "replayed",
        "unmeasured_uh",
        "unpriced_uh",
    )

    def __init__(self) -> None:
        self.alloc_uh = self.busy_uh = self.unmeasured_uh = self.a100eq = self.energy = 0
        self.cost = self.idle_cost = self.energy_cost = self.unpriced_uh = 0
        self.logical: set[str] = set()
        self.records: set[str] = set()
        self.partial: set[str] = set()
        self.replayed: set[str] = set()  # the records metered from a replayed GPU trace

    def add_vec(self, v: Sequence[int]) -> None:
        self.alloc_uh += v[0]
        self.busy_uh += v[1]
        self.unmeasured_uh += v[2]
        self.a100eq += v[3]
        self.energy += v[4]
        self.cost += v[5]
        self.idle_cost += v[6]
        self.energy_cost += v[7]
        self.unpriced_uh += v[8]

    def add(self, ln: CostLine, info: RunInfo | None = None) -> None:
        self.add_vec(compact(ln)[5])
        self.records.add(ln.run_id)
        if info is not None:
            self.logical.add(info.logical_id)
            if partial_flag(info.status, info.ended_at) is not None:
                self.partial.add(info.id)

    def merge(self, other: Totals) -> None:
        self.add_vec(other.vector())
        self.logical |= other.logical
        self.records |= other.records
        self.partial |= other.partial

    def vector(self) -> list[int]:
        return [
            self.alloc_uh,
            self.busy_uh,
            self.unmeasured_uh,
            self.a100eq,
            self.energy,
            self.cost,
            self.idle_cost,
            self.energy_cost,
            self.unpriced_uh,
        ]

    @property
    def idle_uh(self) -> int:
        return self.alloc_uh - self.busy_uh - self.unmeasured_uh

    def cost_per_a100eq(self) -> Decimal | None:
        if self.a100eq <= 0:
            return None
        # cost / (a100eq x 10^-10 h) to 6 places, half to even, in integers: exact, and cheap
        # enough for a trend of thousands of groups and months.
        q, r = divmod(self.cost * A100_SCALE * 10**_RATIO_PLACES, self.a100eq * 10**MONEY_SCALE)
        twice, whole = 2 * r, self.a100eq * 10**MONEY_SCALE
        if twice > whole or (twice == whole and q % 2):
            q += 1
        return Decimal(q).scaleb(-_RATIO_PLACES, EXACT)  # EXACT: no rounding to 28 digits

    def utilization(self) -> float | None:
        measured = self.alloc_uh - self.unmeasured_uh
        return None if measured <= 0 else round(self.busy_uh / measured, 6)

    def idle_share(self) -> float | None:
        measured = self.alloc_uh - self.unmeasured_uh
        return None if measured <= 0 else round(self.idle_uh / measured, 6)


def hours(uh: int) -> float:
    return round(uh / UH_PER_H, 6)


def usage_columns(t: Totals) -> dict[str, Any]:
    """The usage and money columns shared by every section (COLUMNS' ``_USAGE``)."""
    per = t.cost_per_a100eq()
    return {
        "allocated_gpu_h": hours(t.alloc_uh),
        "busy_gpu_h": hours(t.busy_uh),
        "idle_gpu_h": hours(t.idle_uh),
        "unmeasured_gpu_h": hours(t.unmeasured_uh),
        "mean_utilization": t.utilization(),
        "a100eq_h": round(t.a100eq / A100_SCALE, 10),  # as many places as the units: exact
        "energy_kwh": round(t.energy / _ENERGY_SCALE, 9),
        "cost": money_str(t.cost),
        "idle_cost": money_str(t.idle_cost),
        "energy_cost": money_str(t.energy_cost),
        "cost_per_a100eq_h": None if per is None else format(per, "f"),
        "unpriced_gpu_h": hours(t.unpriced_uh),
    }


def share(part: int, whole: int) -> float | None:
    return None if whole <= 0 else round(part / whole, 6)


def sort_key(item: tuple[tuple[str | None, ...], Any]) -> tuple[Any, ...]:
    return tuple((v is None, v or "") for v in item[0])


def as_set(models: Any) -> set[str]:
    if models is None:
        return set()
    return set(models) if isinstance(models, set) else {models}


def totals_of(v: Sequence[int]) -> Totals:
    t = Totals()
    t.add_vec(v)
    return t
