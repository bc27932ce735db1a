"""The cost model (docs/CHARGEBACK.md): GPU use in, priced lines out. Pure: no I/O, no clock.

For each piece of use: ``allocated`` = held GPU-hours, ``busy`` = Σ busy_s / 3600, ``idle`` =
allocated - busy, ``a100eq`` = busy x the model's factor, ``energy`` = Σ energy_j / 3.6e6 x PUE,
``cost`` = billed hours x the rate valid then (+ energy x power price where the card bills it).
A MIG slice counts as the fraction of its parent GPU its profile holds (3g on an A100 -> 3/7), in
hours, energy and so in cost.

Exactness: a ``Usage`` is turned into integer quantities once (money.py). A use that crosses a
month boundary, a price change or the report window's edge is cut there by a cumulative rule
(``_Cutter``): the part before time t always gets ``floor(Q x elapsed / length)`` of quantity Q. The
parts of any cut therefore add up exactly to the whole, whatever the cut points, and cost, which is
linear in integers, is exactly additive over any split of a run in time.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

from gpuledger.core.money import (
    FACTOR_PLACES,
    GPU_MONEY,
    MWH_PER_J,
    UH_PER_S,
    gpu_money,
    joules_to_mwh,
    price_units,
    seconds_to_uh,
)
from gpuledger.core.months import month_bounds, month_of, month_starts
from gpuledger.core.pricing.ratecard import BASES, RateCard, RateLine

__all__ = [
    "AMOUNTS",
    "Compact",
    "CostLine",
    "Pricer",
    "Usage",
    "amounts",
    "compact",
    "measured_amounts",
    "month_bounds",
    "month_of",
    "month_starts",
]


@dataclass(slots=True)
class Usage:
    """What a run used of GPUs of one kind over [t0, t1): the unit the pricer takes. Seconds are
    the run's own (a shared GPU's share already taken); ``gpus`` counts the devices summed in."""

    run_id: str
    gpu_name: str | None
    mig_profile: str | None
    instance_type: str | None
    t0: float
    t1: float
    alloc_s: float
    busy_s: float | None
    energy_j: float | None
    gpus: int = 1
    device_uuid: str | None = None
    share_rule: str | None = None


@dataclass(slots=True)
class CostLine:
    """A priced piece of one Usage, inside one month and one price line. Quantities are integers:
    hours in µh (10^-6 h), A100-equivalent hours in 10^-10 h, energy in 10^-9 kWh, money in
    10^-21 of the card's currency (see money.py)."""

    run_id: str
    model: str  # GPU model key, or the device name when no table entry matches
    instance_type: str | None
    device_uuid: str | None
    month: str  # "YYYY-MM" (UTC)
    t0: float
    t1: float
    gpus: int
    alloc_uh: int
    busy_uh: int  # measured busy; 0 where not measured
    unmeasured_uh: int  # held hours whose busy time is not measured
    a100eq: int  # 10^-10 h; 0 when the model has no factor
    energy: int  # facility energy, 10^-9 kWh (GPU kWh x PUE)
    cost: int  # 10^-21 currency: billed hours x rate + energy cost
    idle_cost: int  # idle hours x rate (billed on the allocated basis, absorbed on the busy basis)
    energy_cost: int
    unpriced_uh: int  # held hours with no rate
    line: RateLine | None = None
    flags: tuple[str, ...] = ()

    @property
    def idle_uh(self) -> int:
        return self.alloc_uh - self.busy_uh - self.unmeasured_uh


# -- exact cutting ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Cutter:
    """Quantities of one use over [t0, t1) (integer ms), handed out to sub-spans cumulatively."""

    t0: int
    t1: int
    totals: tuple[int | None, ...]

    def before(self, q: int | None, t: int) -> int | None:
        if q is None:
            return None
        if t >= self.t1:
            return q
        if t <= self.t0:
            return 0
        return q * (t - self.t0) // (self.t1 - self.t0)

    def part(self, a: int, b: int) -> tuple[int | None, ...]:
        return tuple(None if q is None else self.before(q, b) - self.before(q, a) for q in self.totals)  # type: ignore[operator]


def _ms(t: float) -> int:
    return round(t * 1000)


@dataclass
class Pricer:
    """Prices Usages with one rate card, on one basis, inside an optional window [start, end)."""

    card: RateCard
    basis: str | None = None  # None: the card's
    start: float | None = None
    end: float | None = None
    cuts: tuple[float, ...] = ()  # more times to cut at (a report window's start inside its trend)
    _model_cache: dict[tuple[str | None, str | None], tuple[str, Fraction | None, int | None, tuple[str, ...]]] = field(
        default_factory=dict, repr=False
    )

    def __post_init__(self) -> None:
        self.basis = self.basis or self.card.basis
        if self.basis not in BASES:
            raise ValueError(f"basis must be one of {', '.join(BASES)}, not {self.basis!r}")

    def model_info(
        self, name: str | None, profile: str | None
    ) -> tuple[str, Fraction | None, int | None, tuple[str, ...]]:
        """(model key or name, MIG fraction, factor in 10^-4, flags) for a device name and profile."""
        cache_key = (name, profile)
        found = self._model_cache.get(cache_key)
        if found is None:
            models = self.card.models
            key = models.match(name)
            flags: list[str] = []
            if key is None:
                flags.append("unknown_model")
            fraction = models.mig_fraction(key, profile)
            if profile:
                flags.append("mig" if fraction is not None else "mig_unknown")
            factor = models.factor(key)
            if factor is None:
                flags.append("no_factor")
            found = (
                key or (name or "unknown"),
                fraction,
                None if factor is None else price_units(factor, FACTOR_PLACES),
                tuple(flags),
            )
            self._model_cache[cache_key] = found
        return found

    def price(self, u: Usage) -> list[CostLine]:
        """The priced pieces of ``u``: one per month and price line it touches inside the window."""
        model, fraction, factor_u, model_flags = self.model_info(u.gpu_name, u.mig_profile)
        share = float(fraction) if fraction is not None else 1.0
        alloc = seconds_to_uh(u.alloc_s * share)
        busy = None if u.busy_s is None else min(alloc, seconds_to_uh(u.busy_s * share))
        energy = None if u.energy_j is None else joules_to_mwh(u.energy_j * share)
        lo = u.t0 if self.start is None else max(u.t0, self.start)
        hi = u.t1 if self.end is None else min(u.t1, self.end)
        if hi < lo or (hi == lo and not (u.t0 == u.t1 and lo == u.t0 and (self.end is None or lo < self.end))):
            return []  # outside the window (a zero-length use counts where it happened)
        flags = model_flags + ((f"shared:{u.share_rule}",) if u.share_rule else ())
        instance = self.card.instance(u.instance_type)
        if u.instance_type and instance is None:
            flags += ("unknown_instance",)
        elif instance is not None and instance.model != model:
            flags += ("instance_model_mismatch",)
        if busy is None:
            flags += ("busy_unmeasured",)
        cuts = sorted(
            set(month_starts(lo, hi))
            | set(self.card.cuts(model, u.instance_type, lo, hi))
            | {c for c in self.cuts if lo < c < hi}
        )
        edges = [lo, *cuts, hi]
        if len(edges) == 2 and lo == u.t0 and hi == u.t1:  # the common case: nothing to cut
            return [self._line(u, model, factor_u, flags, lo, hi, alloc, busy, energy)]
        cutter = _Cutter(_ms(u.t0), _ms(u.t1), (alloc, busy, energy))
        out = []
        for a, b in itertools.pairwise(edges):
            part_alloc, part_busy, part_energy = cutter.part(_ms(a), _ms(b))
            out.append(self._line(u, model, factor_u, flags, a, b, part_alloc or 0, part_busy, part_energy))
        return out

    def _context(self, name: str | None, profile: str | None, instance: str | None, at: float) -> tuple[Any, ...]:
        """What ``price_sums`` needs to price any use of one GPU kind within one uniform period."""
        model, fraction, factor_u, flags = self.model_info(name, profile)
        known = self.card.instance(instance)
        if instance and known is None:
            flags += ("unknown_instance",)
        elif known is not None and known.model != model:
            flags += ("instance_model_mismatch",)
        line = self.card.line_at(model, instance, at)
        if line is None:
            flags += ("unpriced",)
        share = float(fraction) if fraction is not None else 1.0
        terms = None
        if line is not None:
            terms = (line.rate_u * GPU_MONEY, line.pue_m, line.energy_u, factor_u or 0, self.basis == "allocated")
        return (model, share, factor_u, flags, line, month_of(at), terms)

    def _line(
        self,
        u: Usage,
        model: str,
        factor_u: int | None,
        flags: tuple[str, ...],
        a: float,
        b: float,
        alloc: int,
        busy: int | None,
        energy: int | None,
    ) -> CostLine:
        line = self.card.line_at(model, u.instance_type, a)
        v = amounts(self.basis, line, factor_u, alloc, busy, energy)  # type: ignore[arg-type]
        return CostLine(
            run_id=u.run_id,
            model=model,
            instance_type=u.instance_type,
            device_uuid=u.device_uuid,
            month=month_of(a),
            t0=a,
            t1=b,
            gpus=u.gpus,
            alloc_uh=v[0],
            busy_uh=v[1],
            unmeasured_uh=v[2],
            a100eq=v[3],
            energy=v[4],
            cost=v[5],
            idle_cost=v[6],
            energy_cost=v[7],
            unpriced_uh=v[8],
            line=line,
            flags=flags if line is not None else (*flags, "unpriced"),
        )

    def price_sums(self, rows: Iterable[Sequence[Any]], periods: Sequence[tuple[float, bool]]) -> list[Compact]:
        """The fast path for many runs: rows of use of one GPU kind inside one period, as
        (run_id, gpu_name, mig_profile, instance_type, period, t0, t1, alloc_s, busy_s, energy_j,
        share_rule). ``periods[i]`` = (a time inside period i, whether one price and one month
        hold all through it). Uniform periods are priced from a cached context, the others like
        ``price``; results are the same as ``price`` would give, as compact tuples."""
        contexts: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        variants: dict[tuple[tuple[str, ...], str | None, bool], tuple[str, ...]] = {}
        out: list[Compact] = []
        basis, lo, hi = self.basis, self.start, self.end
        for run_id, name, profile, instance, period, t0, t1, alloc_s, busy_s, energy_j, rule in rows:
            at, uniform = periods[period]
            if not uniform:
                u = Usage(run_id, name, profile, instance, t0, t1, alloc_s, busy_s, energy_j, 1, None, rule)
                out.extend(compact(ln) for ln in self.price(u))
                continue
            if (lo is not None and t1 <= lo) or (hi is not None and t0 >= hi):
                continue
            key = (name, profile, instance, period)
            ctx = contexts.get(key)
            if ctx is None:
                ctx = contexts[key] = self._context(name, profile, instance, at)
            model, share, factor_u, flags, line, month, _ = ctx
            # Same float operations, in the same order, as seconds_to_uh / joules_to_mwh in price().
            alloc = round(alloc_s * share * UH_PER_S)
            busy = None if busy_s is None else min(alloc, round(busy_s * share * UH_PER_S))
            energy = None if energy_j is None else round(energy_j * share * MWH_PER_J)
            if rule or busy is None:
                variant = (flags, rule, busy is None)
                row_flags = variants.get(variant)
                if row_flags is None:
                    extra = ((f"shared:{rule}",) if rule else ()) + (("busy_unmeasured",) if busy is None else ())
                    row_flags = variants[variant] = flags + extra
            else:
                row_flags = flags
            out.append(
                (run_id, model, instance, month, t0, amounts(basis, line, factor_u, alloc, busy, energy), row_flags)
            )
        return out

    def price_rollups(
        self,
        rows: Iterable[Sequence[Any]],
        runs: Mapping[str, Any],
        period_of_day: Mapping[int, int],
        periods: Sequence[tuple[float, bool]],
    ) -> Iterator[Compact]:
        """``price_sums`` straight from rollup rows (run_id, day, gpu_name, mig_profile, t0, t1,
        alloc_s, busy_s, energy_j, share_rule, instance_type), one pass, for a year of a large
        cluster. ``runs``: the runs to price (others are skipped); ``period_of_day``:
        day number -> period index. A generator: a year's pieces go straight into the report's
        sums without a list of them."""
        contexts: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        slow: list[tuple[Any, ...]] = []
        basis, lo, hi = self.basis, self.start, self.end
        get_ctx = contexts.get
        for run_id, day, name, profile, t0, t1, alloc_s, busy_s, energy_j, rule, instance in rows:
            if run_id not in runs or (lo is not None and t1 <= lo) or (hi is not None and t0 >= hi):
                continue
            period = period_of_day[day]
            key = (name, profile, instance, period)
            ctx = get_ctx(key)
            if ctx is None:
                at, uniform = periods[period]
                ctx = contexts[key] = self._context(name or None, profile or None, instance, at) if uniform else ()
            if not ctx or rule or busy_s is None:  # the rare cases: priced like price_sums
                slow.append(
                    (
                        run_id,
                        name or None,
                        profile or None,
                        instance,
                        period,
                        t0,
                        t1,
                        alloc_s,
                        busy_s,
                        energy_j,
                        rule,
                    )
                )
                continue
            model, share, factor_u, flags, line, month, terms = ctx
            # Same float operations, in the same order, as seconds_to_uh / joules_to_mwh in price().
            alloc = round(alloc_s * share * UH_PER_S)
            busy = min(alloc, round(busy_s * share * UH_PER_S))
            energy = None if energy_j is None else round(energy_j * share * MWH_PER_J)
            if terms is None:
                v = amounts(basis, line, factor_u, alloc, busy, energy)
            else:
                v = measured_amounts(alloc, busy, 0 if energy is None else energy * terms[1], terms)
            yield (run_id, model, instance, month, t0, v, flags)
        if slow:
            yield from self.price_sums(slow, periods)

    def price_all(self, usages: Iterable[Usage]) -> list[CostLine]:
        out: list[CostLine] = []
        for u in usages:
            out.extend(self.price(u))
        return out


def rate_of(line: CostLine) -> Decimal | None:
    return line.line.rate if line.line else None


# A priced piece as a plain tuple, for reports over many runs (the fast path):
# (run_id, model, instance_type, month, t0, amounts, flags); amounts in AMOUNTS order.
Compact = tuple[str, str, "str | None", str, float, tuple[int, ...], tuple[str, ...]]
AMOUNTS = (
    "alloc_uh",
    "busy_uh",
    "unmeasured_uh",
    "a100eq",
    "energy",
    "cost",
    "idle_cost",
    "energy_cost",
    "unpriced_uh",
)


def amounts(
    basis: str, line: RateLine | None, factor_u: int | None, alloc: int, busy: int | None, energy: int | None
) -> tuple[int, int, int, int, int, int, int, int, int]:
    """The integer figures of one priced piece (AMOUNTS order): the one place cost is computed."""
    busy_uh = busy or 0
    unmeasured = alloc if busy is None else 0
    a100eq = 0 if factor_u is None else busy_uh * factor_u
    if line is None:
        energy_units = 0 if energy is None else energy * 1000
        return (alloc, busy_uh, unmeasured, a100eq, energy_units, 0, 0, 0, alloc)
    energy_units = 0 if energy is None else energy * line.pue_m
    billed = alloc if basis == "allocated" else busy_uh + unmeasured
    energy_cost = energy_units * line.energy_u
    cost = gpu_money(billed, line.rate_u) + energy_cost
    idle_cost = gpu_money(alloc - busy_uh - unmeasured, line.rate_u)
    return (alloc, busy_uh, unmeasured, a100eq, energy_units, cost, idle_cost, energy_cost, 0)


def measured_amounts(
    alloc: int, busy: int, units: int, terms: tuple[int, int, int, int, bool]
) -> tuple[int, int, int, int, int, int, int, int, int]:
    """amounts() for a priced, measured piece of a whole GPU (or slice), from its integer
    quantities (``units``: energy x PUE) and its line's constants taken once (Pricer._context's
    ``terms``). Linear in the quantities: summed quantities give the summed amounts exactly."""
    rate_k, _pue_m, energy_u, factor, by_alloc = terms
    energy_cost = units * energy_u
    cost = (alloc if by_alloc else busy) * rate_k + energy_cost
    return (alloc, busy, 0, busy * factor, units, cost, (alloc - busy) * rate_k, energy_cost, 0)


def compact(ln: CostLine) -> Compact:
    v = (
        ln.alloc_uh,
        ln.busy_uh,
        ln.unmeasured_uh,
        ln.a100eq,
        ln.energy,
        ln.cost,
        ln.idle_cost,
        ln.energy_cost,
        ln.unpriced_uh,
    )
    return (ln.run_id, ln.model, ln.instance_type, ln.month, ln.t0, v, ln.flags)
