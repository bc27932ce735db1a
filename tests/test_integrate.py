"""Property tests for the pure counter and power integrals: any split of a trace sums to the whole."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.core.metering.integrate import (
    counter_delta,
    implausible_counter,
    surely_plausible_mj,
    trapezoid_energy_j,
)


@pytest.mark.parametrize("width", [32, 64])
@given(data=st.data())
def test_counter_deltas_sum_to_the_increase_across_wraps(width, data) -> None:
    span = 1 << width
    start = data.draw(st.integers(0, span - 1))
    incs = data.draw(st.lists(st.integers(0, (span >> 2) - 1), min_size=1, max_size=40))
    value, total = start, 0
    for inc in incs:
        nxt = (value + inc) % span
        delta = counter_delta(value, nxt, width)
        assert delta == inc
        total += delta
        value = nxt
    assert total == sum(incs)


def test_counter_reset_is_none_and_first_reading_is_none() -> None:
    assert counter_delta(5_000_000_000, 1_234, 64) is None  # driver reload: far below previous
    assert counter_delta(3_000_000_000, 10, 32) is None  # wrapped delta would be > 1/4 of the range
    assert counter_delta(None, 10) is None
    assert counter_delta((1 << 64) - 10, 5) == 15  # a real wrap


@given(
    st.lists(
        st.tuples(st.floats(0.001, 10), st.floats(0, 1000)),
        min_size=2,
        max_size=30,
    ),
    st.integers(0, 29),
)
def test_trapezoid_joules_over_any_split_of_a_trace_sum_to_the_whole(steps, cut) -> None:
    pts, t = [], 0.0
    for dt, p in steps:
        t += dt
        pts.append((t, p))

    def energy(points: list[tuple[float, float]]) -> float:
        return sum(trapezoid_energy_j(t0, p0, t1, p1) for (t0, p0), (t1, p1) in itertools.pairwise(points))

    k = cut % (len(pts) - 1) + 1
    assert math.isclose(energy(pts[: k + 1]) + energy(pts[k:]), energy(pts), rel_tol=1e-9, abs_tol=1e-6)


@settings(max_examples=200)
@given(st.floats(0, 1e6), st.floats(0.001, 1e4), st.floats(0, 1000), st.floats(0, 1000), st.floats(0, 1))
def test_trapezoid_split_inside_a_segment_keeps_the_energy(t0, dt, p0, p1, f) -> None:
    t1, tm = t0 + dt, t0 + f * dt
    pm = p0 + (p1 - p0) * f  # power is assumed linear between readings
    whole = trapezoid_energy_j(t0, p0, t1, p1)
    assert math.isclose(
        trapezoid_energy_j(t0, p0, tm, pm) + trapezoid_energy_j(tm, pm, t1, p1), whole, rel_tol=1e-9, abs_tol=1e-6
    )
    assert math.isclose(trapezoid_energy_j(0, 300.0, 10, 300.0), 3000.0)


@given(
    limit=st.floats(20, 1500),
    levels=st.lists(st.tuples(st.floats(0.05, 1), st.floats(0.001, 5)), min_size=1, max_size=12),
    step_s=st.sampled_from([0.0, 0.02, 0.1]),
    t0=st.floats(0, 20),
    seconds=st.floats(0, 40),
)
def test_a_counter_that_counts_what_the_gpu_drew_is_never_judged_implausible(limit, levels, step_s, t0, seconds):
    # A GPU drawing between its idle floor (5 % of the limit: real ones idle at 10-20 %) and its
    # limit, read through a counter that moves every step_s (a reading is the value at its last
    # update), over any span: neither "stuck" nor "spike".
    ends = list(itertools.accumulate(d for _, d in levels))

    def draw(t: float) -> float:  # the stepped power trace, its last level held for ever
        return next((f for (f, _), e in zip(levels, ends, strict=True) if t < e), levels[-1][0]) * limit

    def energy(t: float) -> float:  # exact integral of draw over [0, t]
        total, a = 0.0, 0.0
        for (f, _), e in zip(levels, ends, strict=True):
            total += f * limit * max(0.0, min(t, e) - a)
            a = e
        return total + levels[-1][0] * limit * max(0.0, t - ends[-1])

    def reading(t: float) -> float:
        return energy(math.floor(t / step_s) * step_s if step_s else t)

    t1 = t0 + seconds
    joules = reading(t1) - reading(t0)
    assert implausible_counter(joules, seconds, draw(t0), draw(t1), limit) is None


def test_broken_counter_readings_are_named() -> None:
    assert implausible_counter(0.0, 1.0, 300.0, 310.0, 700.0) == "stuck"
    assert implausible_counter(0.0, 0.5, 300.0, 310.0, 700.0) is None  # shorter than the counter can be trusted to move
    assert implausible_counter(0.0, 5.0, 0.0, 310.0, 700.0) is None  # a reading of no draw: idle may be true
    assert implausible_counter(0.0, 5.0, None, 310.0, 700.0) is None
    assert implausible_counter(3.69e12, 1.0, 300.0, 310.0, 700.0) == "spike"  # the terawatt readings of the field
    assert implausible_counter(2 * 700.0 * 2.0 + 1, 1.0, 300.0, 310.0, 700.0) == "spike"
    assert implausible_counter(2 * 700.0 * 2.0, 1.0, 300.0, 310.0, 700.0) is None
    assert implausible_counter(5000.0 * 2 + 1, 1.0, 300.0, 310.0, None) == "spike"  # no limit known: 5 kW


@given(limit=st.one_of(st.none(), st.floats(1, 2000)), mj=st.integers(1, 10**9), seconds=st.floats(0, 100))
def test_the_fast_path_passes_only_what_the_check_passes(limit, mj, seconds) -> None:
    if mj <= surely_plausible_mj(limit):
        assert implausible_counter(mj / 1000, seconds, 300.0, 300.0, limit) is None
