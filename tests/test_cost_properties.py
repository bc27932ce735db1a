"""Property tests of the cost arithmetic: exactly additive, basis-independent quantities, groups
that sum to the total, shared-GPU splits that conserve what the GPU did."""

from __future__ import annotations

import itertools
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from cost_support import card, ts
from gpuledger.core.chargeback.report import RunInfo, build_chargeback
from gpuledger.core.pricing.cost import Pricer, Usage
from gpuledger.core.pricing.share import Reading, Tenant, attribute
from gpuledger.core.pricing.usage import Segment, days_from_segments

T0 = ts("2026-01-20")
SPAN = 80 * 86400.0  # late January to April: two month boundaries and the price changes below
PRICED = card(
    """
[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "2.50"
effective_to = 2026-02-10T06:30:00Z

[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "2.875"
effective_from = 2026-02-10T06:30:00Z
effective_to = 2026-03-01

[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "3.10"
effective_from = 2026-03-01
power_price_per_kwh = "0.17"
pue = "1.35"

[[gpu]]
model = "T4"
price_per_hour = "0.526"

[[instance]]
type = "p4d.24xlarge"
gpu_model = "A100-40GB-SXM"
gpus = 8
price_per_hour = "21.96"
effective_from = 2026-03-20
"""
)
NAMES = ["NVIDIA A100-SXM4-40GB", "Tesla T4", "NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-40GB MIG 3g.20gb"]


@st.composite
def usages(draw: st.DrawFn) -> Usage:
    t0 = T0 + draw(st.floats(0, SPAN - 10))
    length = draw(st.floats(0, 20 * 86400.0))
    gpus = draw(st.integers(1, 8))
    alloc = length * gpus
    util = draw(st.one_of(st.none(), st.floats(0, 1)))
    energy = draw(st.one_of(st.none(), st.floats(0, 700 * max(alloc, 1.0))))
    return Usage(
        run_id=draw(st.sampled_from(["r1", "r2", "r3", "r4"])),
        gpu_name=(name := draw(st.sampled_from(NAMES))),
        mig_profile="3g.20gb" if "MIG" in name else None,
        instance_type=draw(st.sampled_from([None, "p4d.24xlarge"])),
        t0=t0,
        t1=t0 + length,
        alloc_s=alloc,
        busy_s=None if util is None else alloc * util,
        energy_j=energy,
        gpus=gpus,
    )


def _sums(lines):  # type: ignore[no-untyped-def]
    return (
        sum(ln.cost for ln in lines),
        sum(ln.alloc_uh for ln in lines),
        sum(ln.busy_uh for ln in lines),
        sum(ln.energy for ln in lines),
        sum(ln.idle_cost for ln in lines),
        sum(ln.a100eq for ln in lines),
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(usages(), min_size=1, max_size=6),
    st.floats(0, 1),
    st.sampled_from(["allocated", "busy"]),
)
def test_cost_is_exactly_additive_over_any_split_in_time(runs: list[Usage], where: float, basis: str) -> None:
    start, end = T0 - 86400, T0 + SPAN + 21 * 86400
    cut = start + where * (end - start)
    whole = _sums(Pricer(PRICED, basis, start, end).price_all(runs))
    before = _sums(Pricer(PRICED, basis, start, cut).price_all(runs))
    after = _sums(Pricer(PRICED, basis, cut, end).price_all(runs))
    assert whole == tuple(a + b for a, b in zip(before, after, strict=False))


@settings(max_examples=200, deadline=None)
@given(st.lists(usages(), min_size=1, max_size=6), st.lists(st.floats(0, 1), min_size=1, max_size=4))
def test_split_at_many_points_still_adds_up(runs: list[Usage], points: list[float]) -> None:
    start, end = T0 - 86400, T0 + SPAN + 21 * 86400
    edges = sorted({start, end, *(start + p * (end - start) for p in points)})
    whole = _sums(Pricer(PRICED, None, start, end).price_all(runs))
    parts = [_sums(Pricer(PRICED, None, a, b).price_all(runs)) for a, b in itertools.pairwise(edges)]
    assert whole == tuple(sum(p[i] for p in parts) for i in range(len(whole)))


@settings(max_examples=200, deadline=None)
@given(st.lists(usages(), min_size=1, max_size=6))
def test_the_billing_basis_never_changes_hours_or_energy(runs: list[Usage]) -> None:
    alloc = Pricer(PRICED, "allocated").price_all(runs)
    busy = Pricer(PRICED, "busy").price_all(runs)
    key = [(ln.alloc_uh, ln.busy_uh, ln.unmeasured_uh, ln.energy, ln.a100eq, ln.idle_cost) for ln in alloc]
    assert key == [(ln.alloc_uh, ln.busy_uh, ln.unmeasured_uh, ln.energy, ln.a100eq, ln.idle_cost) for ln in busy]
    # allocated bills at least what busy bills (the same rate, more hours)
    assert sum(ln.cost for ln in alloc) >= sum(ln.cost for ln in busy)


_INFO = {
    f"r{i}": RunInfo(f"r{i}", "r1" if i == 2 else f"r{i}", status, user, team, project)
    for i, (status, user, team, project) in enumerate(
        [
            ("succeeded", "ana", "vision", "det"),
            ("killed", "bo", "vision", "seg"),
            ("succeeded", "ana", "nlp", None),
            ("lost", "cy", None, "det"),
            ("succeeded", "bo", "nlp", "llm"),
        ]
    )
}


@settings(max_examples=150, deadline=None)
@given(
    st.lists(usages(), min_size=1, max_size=8),
    st.lists(
        st.sampled_from(["team", "project", "user", "gpu_model", "instance_type", "status"]),
        min_size=1,
        max_size=3,
        unique=True,
    ),
)
def test_chargeback_groups_sum_exactly_to_the_total(runs: list[Usage], by: list[str]) -> None:
    lines = Pricer(PRICED).price_all(runs)
    cb = build_chargeback(lines, _INFO, by=by, start=T0 - 86400, months=["2026-01", "2026-02", "2026-03", "2026-04"])
    for column in ("cost", "idle_cost", "energy_cost"):
        assert sum(Decimal(g[column]) for g in cb.groups) == Decimal(cb.total[column])
    for column in ("allocated_gpu_h", "busy_gpu_h", "idle_gpu_h", "energy_kwh", "unpriced_gpu_h"):
        # 6-place floats of exact integer sums: their decimal forms add up exactly
        assert sum(Decimal(str(g[column])) for g in cb.groups) == Decimal(str(cb.total[column]))
    shares = [g["share"] for g in cb.groups if g["share"] is not None]
    assert not shares or abs(sum(shares) - 1) < 1e-5
    total_trend = [r for r in cb.trend if r[by[0]] == "TOTAL"]
    assert sum(Decimal(r["cost"]) for r in total_trend) == Decimal(cb.total["cost"])
    # The total does not depend on how it is grouped.
    other = build_chargeback(lines, _INFO, by=["team"], start=T0 - 86400, months=["2026-01", "2026-02"])
    for column in ("runs", "attempts", "cost", "idle_cost", "allocated_gpu_h", "energy_kwh", "partial_runs"):
        assert cb.total[column] == other.total[column], column


@st.composite
def tenants(draw: st.DrawFn) -> list[Tenant]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        start = draw(st.floats(0, 1000))
        end = start + draw(st.floats(1, 2000))
        readings, t = [], start
        while t < end:
            step = min(end - t, draw(st.floats(5, 400)))
            sm = draw(st.one_of(st.none(), st.floats(0, 100)))
            readings.append(
                Reading(t, t + step, step * 0.6, step * 250.0, sm, draw(st.one_of(st.none(), st.floats(0, 1e9))))
            )
            t += step
        out.append(Tenant(f"r{i}", start, end, readings))
    return out


@settings(max_examples=100, deadline=None)
@given(tenants())
def test_a_shared_gpu_is_billed_once_and_its_work_conserved(group: list[Tenant]) -> None:
    parts = attribute(group)
    union = _union_length([(t.start, t.end) for t in group])
    alloc = sum(s.alloc_s for segs in parts.values() for s in segs)
    assert abs(alloc - union) < 1e-6 * max(1.0, union)
    # every run recorded the device at 60 % busy and 250 W: the split keeps exactly that
    busy = sum(s.busy_s or 0.0 for segs in parts.values() for s in segs)
    energy = sum(s.energy_j or 0.0 for segs in parts.values() for s in segs)
    assert abs(busy - 0.6 * union) < 1e-6 * max(1.0, union)
    assert abs(energy - 250 * union) < 1e-4 * max(1.0, union)
    for t in group:  # nobody gets time outside their own span
        assert all(t.start <= s.t0 and s.t1 <= t.end for s in parts[t.run_id])


def _union_length(spans: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= reach:
            continue
        total += b - max(a, reach)
        reach = b
    return total


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5 * 86400), st.floats(0, 3 * 86400), st.floats(0, 1)), min_size=1, max_size=10))
def test_day_rows_keep_every_second_busy_second_and_joule(raw: list[tuple[float, float, float]]) -> None:
    segments = [Segment(T0 + a, T0 + a + n, n, n * u, n * 100.0) for a, n, u in raw]
    days = days_from_segments("r", "g", segments)
    totals = (
        ("alloc_s", sum(n for _, n, _ in raw)),
        ("busy_s", sum(n * u for _, n, u in raw)),
        ("energy_j", sum(n * 100 for _, n, _ in raw)),
    )
    for attr, expected in totals:
        got = sum(getattr(d, attr) for d in days)
        assert abs(got - expected) < 1e-6 * max(1.0, expected)
    assert all(d.t1 - d.t0 <= 86400 and d.busy_s <= d.alloc_s + 1e-9 for d in days)


class _Run:
    def __init__(self, instance_type: str | None) -> None:
        self.instance_type = instance_type


@settings(max_examples=150, deadline=None)
@given(st.lists(usages(), min_size=1, max_size=8), st.sampled_from(["allocated", "busy"]))
def test_the_fast_path_prices_exactly_like_the_slow_one(runs: list[Usage], basis: str) -> None:
    # Rollup-shaped rows (one per usage, inside one day) through price_rollups vs price().
    from gpuledger.core.pricing.cost import compact

    day_rows, usages_, run_map = [], [], {}
    for i, u in enumerate(runs):
        t0 = T0 + (u.t0 - T0) % (20 * 86400)  # away from the price changes' days
        day = int(t0 // 86400)
        t0 = day * 86400.0 + 3600
        t1 = t0 + min(u.t1 - u.t0, 20 * 3600.0)
        rid = f"r{i}"
        run_map[rid] = _Run(u.instance_type)
        name, profile, instance = u.gpu_name or "", u.mig_profile or "", u.instance_type
        day_rows.append((rid, day, name, profile, t0, t1, u.alloc_s, u.busy_s, u.energy_j, None, instance))
        usages_.append(Usage(rid, u.gpu_name, u.mig_profile, u.instance_type, t0, t1, u.alloc_s, u.busy_s, u.energy_j))
    pricer = Pricer(PRICED, basis)
    days = sorted({r[1] for r in day_rows})
    period_of_day = {d: i for i, d in enumerate(days)}
    periods = [(d * 86400.0, True) for d in days]

    def norm(items):  # type: ignore[no-untyped-def]
        return sorted((*c[:6], tuple(sorted(c[6]))) for c in items)  # flags are a set

    fast = norm(pricer.price_rollups(day_rows, run_map, period_of_day, periods))
    slow = norm(compact(ln) for ln in Pricer(PRICED, basis).price_all(usages_))
    assert fast == slow


@given(st.integers(0, 10**40), st.integers(1, 10**20))
def test_cost_per_a100eq_hour_is_the_exact_quotient_rounded_half_even(cost: int, a100eq: int) -> None:
    from decimal import ROUND_HALF_EVEN, Context

    from gpuledger.core.chargeback.totals import A100_SCALE, Totals
    from gpuledger.core.money import MONEY_SCALE

    t = Totals()
    t.cost, t.a100eq = cost, a100eq
    exact = Context(prec=200).divide(Decimal(cost * A100_SCALE), Decimal(a100eq) * Decimal(10) ** MONEY_SCALE)
    assert t.cost_per_a100eq() == exact.quantize(Decimal("0.000001"), ROUND_HALF_EVEN, Context(prec=200))
    assert len(format(t.cost_per_a100eq(), "f").split(".")[1]) == 6  # as reports print it
