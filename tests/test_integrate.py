"""Property tests for the pure integrals: any split of a trace sums to the whole."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.core.integrate import busy_seconds_from_samples, counter_delta, trapezoid_energy_j

PERIOD_S = 1 / 6


@st.composite
def sample_traces(draw: st.DrawFn) -> list[tuple[int, float]]:
    """Sorted, distinct µs timestamps with utilisation percentages (ints, as NVML reports)."""
    gaps = draw(st.lists(st.integers(1, 2_000_000), min_size=1, max_size=60))
    values = draw(st.lists(st.integers(0, 100), min_size=len(gaps), max_size=len(gaps)))
    ts, out = 1_700_000_000_000_000, []
    for gap, v in zip(gaps, values, strict=True):
        ts += gap
        out.append((ts, float(v)))
    return out


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


@given(sample_traces(), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1))
def test_busy_over_a_split_window_sums_to_the_whole(samples, a, b, c) -> None:
    lo, hi = samples[0][0] - 1_000_000, samples[-1][0] + 1_000_000
    t0, tm, t1 = sorted(int(lo + x * (hi - lo)) for x in (a, b, c))
    whole = busy_seconds_from_samples(samples, t0, t1, PERIOD_S)
    parts = busy_seconds_from_samples(samples, t0, tm, PERIOD_S) + busy_seconds_from_samples(samples, tm, t1, PERIOD_S)
    assert close(whole, parts)
    assert 0 <= whole <= (t1 - t0) / 1e6 + 1e-9


@given(sample_traces(), st.lists(st.integers(0, 10_000), max_size=8))
def test_busy_in_cursor_chunks_equals_whole_buffer(samples, cuts) -> None:
    """How the collector calls it: each read gets the samples newer than its cursor."""
    cursor0 = samples[0][0] - 100_000
    bounds = sorted({c % len(samples) for c in cuts} | {len(samples)})
    total, cursor, start = 0.0, cursor0, 0
    for end in bounds:
        chunk = samples[start:end]
        if chunk:
            total += busy_seconds_from_samples(chunk, cursor, chunk[-1][0], PERIOD_S, prev_ts_us=cursor)
            cursor, start = chunk[-1][0], end
    whole = busy_seconds_from_samples(samples, cursor0, samples[-1][0], PERIOD_S, prev_ts_us=cursor0)
    assert close(total, whole)


@given(st.integers(0, 100), st.integers(2, 50))
def test_constant_utilisation_gives_that_share_of_the_window(pct, n) -> None:
    period = 166_667
    samples = [(k * period, float(pct)) for k in range(1, n + 1)]
    busy = busy_seconds_from_samples(samples, 0, n * period, PERIOD_S, prev_ts_us=0)
    assert close(busy, pct / 100 * n * period / 1e6)


def test_first_sample_without_cursor_covers_one_period_hint() -> None:
    assert close(busy_seconds_from_samples([(1_000_000, 50.0)], 0, 2_000_000, 0.5), 0.25)


def test_out_of_range_percent_is_clamped() -> None:
    assert busy_seconds_from_samples([(1_000_000, 250.0)], 0, 2_000_000, 1.0, prev_ts_us=0) == 1.0
    assert busy_seconds_from_samples([(1_000_000, -5.0)], 0, 2_000_000, 1.0, prev_ts_us=0) == 0.0


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
