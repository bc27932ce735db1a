"""A rate card, validated and ready to price: price lines by GPU model and by cloud instance type,
each valid over a span of time, plus the card's currency, billing basis and GPU model table.

Built by ``ratecard_load.parse_rate_card`` (schema: docs/RATE_CARDS.md). Lines are looked up by
time: a run that spans a price change is priced by each line for the part of it that line covers.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field
from decimal import Decimal

from gpuledger.core.gpumodels import ModelTable

__all__ = ["BASES", "Instance", "RateCard", "RateLine"]

BASES = ("allocated", "busy")


@dataclass(frozen=True)
class RateLine:
    """One price valid from ``start`` (inclusive) to ``end`` (exclusive), epoch seconds; None: open."""

    kind: str  # "gpu" (a GPU model's price) or "instance" (a cloud instance type's)
    key: str  # the model key or the instance type, as the card spells it
    model: str  # the GPU model key it prices
    rate: Decimal  # per GPU-hour (an instance's price divided by its GPU count)
    rate_u: int  # the same in 10^-12 currency units
    energy_price: Decimal | None = None  # per facility kWh (GPU kWh x PUE), None: energy not billed
    energy_u: int = 0
    pue: Decimal = Decimal(1)
    pue_m: int = 1000
    start: float | None = None
    end: float | None = None
    gpus: int = 1
    source: str = ""
    where: str = ""  # "rates.toml:14": where the line was written
    derivation: str = ""  # how a derived rate was computed (on-prem, instance / GPUs, VM + GPU)

    def covers(self, t: float) -> bool:
        return (self.start is None or self.start <= t) and (self.end is None or t < self.end)


@dataclass(frozen=True)
class Instance:
    """A cloud instance type: which GPU model and how many. Its price lines may be absent, then its
    GPUs are priced by the GPU model's lines."""

    type: str
    model: str
    gpus: int
    where: str = ""


@dataclass
class _Timeline:
    """Lines of one key, sorted and non-overlapping, with their start times for bisection."""

    lines: list[RateLine]
    starts: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.lines.sort(key=lambda ln: -math.inf if ln.start is None else ln.start)
        self.starts = [-math.inf if ln.start is None else ln.start for ln in self.lines]

    def at(self, t: float) -> RateLine | None:
        i = bisect.bisect_right(self.starts, t) - 1
        if i >= 0 and self.lines[i].covers(t):
            return self.lines[i]
        return None

    def cuts(self, t0: float, t1: float) -> list[float]:
        """Line starts / ends strictly inside (t0, t1)."""
        out = set()
        for ln in self.lines:
            for edge in (ln.start, ln.end):
                if edge is not None and t0 < edge < t1:
                    out.add(edge)
        return sorted(out)


class RateCard:
    """Prices by GPU model and instance type over time; see docs/RATE_CARDS.md."""

    def __init__(
        self,
        *,
        currency: str,
        basis: str,
        models: ModelTable,
        gpu_lines: list[RateLine],
        instance_lines: list[RateLine],
        instances: list[Instance],
        name: str = "",
        source: str = "",
        description: str = "",
    ) -> None:
        if basis not in BASES:
            raise ValueError(f"basis must be one of {', '.join(BASES)}, not {basis!r}")
        self.currency = currency
        self.basis = basis
        self.models = models
        self.name = name
        self.source = source  # the file it came from
        self.description = description
        self.instances = {i.type.lower(): i for i in instances}
        self._gpu = _group(gpu_lines, lambda ln: ln.model)
        self._instance = _group(instance_lines, lambda ln: ln.key.lower())
        self.gpu_lines = tuple(gpu_lines)
        self.instance_lines = tuple(instance_lines)
        edges = {e for ln in (*gpu_lines, *instance_lines) for e in (ln.start, ln.end) if e is not None}
        self.change_points: tuple[float, ...] = tuple(sorted(edges))

    def instance(self, instance_type: str | None) -> Instance | None:
        return self.instances.get(instance_type.lower()) if instance_type else None

    def line_at(self, model: str | None, instance_type: str | None, t: float) -> RateLine | None:
        """The line pricing a GPU of ``model`` on ``instance_type`` at time ``t``: the instance's
        own price when it has one then, else the GPU model's; None when neither is priced."""
        if instance_type:
            timeline = self._instance.get(instance_type.lower())
            line = timeline.at(t) if timeline else None
            if line is not None:
                return line
        timeline = self._gpu.get(model) if model else None
        return timeline.at(t) if timeline else None

    def periods(
        self, model: str | None, instance_type: str | None, t0: float, t1: float
    ) -> list[tuple[float, float, RateLine | None]]:
        """[t0, t1) cut where the price of such a GPU changes: (start, end, line) in time order, with
        neighbours at the same line joined (an instance price that ends falls back to the model's)."""
        out: list[tuple[float, float, RateLine | None]] = []
        edges = [t0, *self.cuts(model, instance_type, t0, t1), t1]
        for a, b in itertools.pairwise(edges):
            line = self.line_at(model, instance_type, a)
            if out and out[-1][2] is line:
                out[-1] = (out[-1][0], b, line)
            else:
                out.append((a, b, line))
        return out

    def cuts(self, model: str | None, instance_type: str | None, t0: float, t1: float) -> list[float]:
        """The times inside (t0, t1) where the price of such a GPU may change."""
        out: set[float] = set()
        for timeline in (
            self._instance.get(instance_type.lower()) if instance_type else None,
            self._gpu.get(model or ""),
        ):
            if timeline is not None:
                out.update(timeline.cuts(t0, t1))
        return sorted(out)


def _group(lines: list[RateLine], key) -> dict[str, _Timeline]:  # type: ignore[no-untyped-def]
    grouped: dict[str, list[RateLine]] = {}
    for ln in lines:
        grouped.setdefault(key(ln), []).append(ln)
    return {k: _Timeline(v) for k, v in grouped.items()}
