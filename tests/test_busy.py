"""Busy time from utilisation samples (core/metering/busy.py): each sample covers at most one period."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.core.metering.busy import PERIOD_MAX_S, PERIOD_MIN_S, SamplePeriod, busy_from_samples

P_US = 166_667
P_S = P_US / 1e6
T0 = 1_700_000_000_000_000


@st.composite
def sample_streams(draw: st.DrawFn) -> list[tuple[int, float]]:
    """Sorted µs timestamps (dense runs and idle gaps) with integer percentages, as NVML reports them."""
    gaps = draw(st.lists(st.one_of(st.integers(P_US - 3_000, P_US + 3_000), st.integers(1, 30_000_000)),
                         min_size=1, max_size=80))  # fmt: skip
    values = draw(st.lists(st.integers(0, 100), min_size=len(gaps), max_size=len(gaps)))
    ts, out = T0, []
    for gap, v in zip(gaps, values, strict=True):
        ts += gap
        out.append((ts, float(v)))
    return out


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


@given(sample_streams(), st.lists(st.integers(0, 10_000), max_size=8))
def test_reads_in_cursor_chunks_sum_to_the_whole_stream(samples, cuts) -> None:
    """How the collector calls it: each read gets the samples newer than its cursor."""
    cursor0 = samples[0][0] - 2 * P_US
    bounds = sorted({c % len(samples) for c in cuts} | {len(samples)})
    busy = sampled = idle = 0.0
    cursor, start = cursor0, 0
    for end in bounds:
        chunk = samples[start:end]
        if chunk:
            r = busy_from_samples(chunk, cursor, P_S)
            busy, sampled, idle = busy + r.busy_s, sampled + r.sampled_s, idle + r.idle_s
            assert r.last_us == chunk[-1][0]
            cursor, start = chunk[-1][0], end
    whole = busy_from_samples(samples, cursor0, P_S)
    assert close(busy, whole.busy_s) and close(sampled, whole.sampled_s) and close(idle, whole.idle_s)
    # every instant from the cursor to the newest sample is either sampled or idle, once
    assert close(whole.sampled_s + whole.idle_s, (samples[-1][0] - cursor0) / 1e6)


@given(sample_streams(), st.booleans())
def test_busy_never_exceeds_the_time_its_samples_cover(samples, first_gap_unknown) -> None:
    cursor = samples[0][0] - 5_000_000
    r = busy_from_samples(samples, cursor, P_S, first_gap_unknown=first_gap_unknown)
    assert 0 <= r.busy_s <= r.sampled_s + 1e-12
    assert r.sampled_s <= len(samples) * P_S + 1e-9  # at most one period per sample
    assert close(r.sampled_s + r.idle_s + r.unknown_s, (samples[-1][0] - cursor) / 1e6)


def test_a_sample_after_an_idle_gap_covers_one_period_not_the_gap() -> None:
    # The driver stopped sampling for 10 s (idle), then a busy sample: 1/6 s of busy time, not 10 s.
    r = busy_from_samples([(T0 + 10_000_000, 100.0)], T0, P_S)
    assert close(r.busy_s, P_S)
    assert close(r.idle_s, 10 - P_S) and r.unknown_s == 0
    lost = busy_from_samples([(T0 + 10_000_000, 100.0)], T0, P_S, first_gap_unknown=True)
    assert close(lost.busy_s, P_S) and close(lost.unknown_s, 10 - P_S) and lost.idle_s == 0


@given(st.integers(0, 100), st.integers(2, 50))
def test_constant_utilisation_on_a_grid_gives_that_share(pct, n) -> None:
    samples = [(T0 + k * P_US, float(pct)) for k in range(1, n + 1)]
    r = busy_from_samples(samples, T0, P_S)
    assert close(r.busy_s, pct / 100 * n * P_US / 1e6)
    assert r.idle_s == 0 and r.max_pct == pct


def test_without_a_cursor_the_first_sample_covers_one_period() -> None:
    r = busy_from_samples([(T0, 50.0)], None, 0.5)
    assert close(r.busy_s, 0.25) and r.idle_s == 0 and r.unknown_s == 0


def test_out_of_range_percent_is_clamped() -> None:
    assert busy_from_samples([(T0 + 1_000_000, 250.0)], T0, 1.0).busy_s == 1.0
    assert busy_from_samples([(T0 + 1_000_000, -5.0)], T0, 1.0).busy_s == 0.0


def reference_busy(samples: list[tuple[int, float]], cursor: int, period_us: int) -> tuple[float, float, float, float]:
    """The rule as written in the module docstring, one sample at a time: (busy, sampled, idle, max)."""
    busy = sampled = idle = 0.0
    top = -1.0
    prev = cursor
    for ts, pct in samples:
        start = max(ts - period_us, prev)
        idle += start - prev
        value = min(max(pct, 0.0), 100.0)
        if ts > start:
            busy += value * (ts - start) / 100
            sampled += ts - start
            top = max(top, value)
        prev = ts
    return busy / 1e6, sampled / 1e6, idle / 1e6, top


@given(
    st.lists(st.tuples(st.sampled_from([0, 0, P_US // 2, P_US, P_US + 7, 3 * P_US]), st.integers(-20, 300)),
             min_size=1, max_size=40),
)  # fmt: skip
def test_matches_the_rule_with_repeated_instants_and_out_of_range_values(steps) -> None:
    """Samples at the same instant cover nothing; values outside 0-100 (seen in the field) are clamped,
    wherever they are in the batch (the hot loop handles in-range batches, another path the rest)."""
    ts, samples = T0, []
    for gap, value in steps:
        ts += gap or 0
        samples.append((ts + P_US, float(value)))
    r = busy_from_samples(samples, T0, P_S)
    busy, sampled, idle, top = reference_busy(samples, T0, P_US)
    assert close(r.busy_s, busy) and close(r.sampled_s, sampled) and close(r.idle_s, idle)
    assert r.max_pct == top and r.unknown_s == 0 and r.last_us == samples[-1][0]
    # the least spacing of at most one period tells the reader whether the period can be learned
    spacings = [b[0] - a[0] for a, b in itertools.pairwise(samples) if b[0] - a[0] <= P_US]
    assert r.least_gap_us == min(spacings, default=math.inf)


def test_a_sample_at_the_same_instant_covers_nothing() -> None:
    r = busy_from_samples([(T0 + P_US, 10.0), (T0 + P_US, 90.0), (T0 + 2 * P_US, 20.0)], T0, P_S)
    assert close(r.busy_s, 0.3 * P_S) and close(r.sampled_s, 2 * P_S) and r.max_pct == 20.0


def test_no_samples_is_nothing() -> None:
    r = busy_from_samples([], T0, P_S)
    assert (r.busy_s, r.sampled_s, r.idle_s, r.unknown_s, r.max_pct, r.last_us) == (0, 0, 0, 0, None, None)


# -- the sample period --------------------------------------------------------------------------


def grid(start: int, n: int, spacing_us: int, pct: float) -> list[tuple[int, float]]:
    return [(start + k * spacing_us, pct) for k in range(n)]


def test_period_is_learned_from_busy_sampling() -> None:
    p = SamplePeriod()
    assert p.seconds == PERIOD_MIN_S and not p.learned
    p.observe(grid(T0, 6, 1_000_000, 80.0))  # a product that samples once a second
    assert p.learned and 1.0 <= p.seconds <= PERIOD_MAX_S * 1.1


def test_idle_slow_sampling_does_not_stretch_the_period() -> None:
    p = SamplePeriod()
    p.observe(grid(T0, 10, 2_000_000, 0.0))  # the driver slowed down on an idle GPU
    assert not p.learned and p.seconds == PERIOD_MIN_S
    p.observe([(T0 + 25_000_000, 0.0), (T0 + 27_000_000, 60.0)])  # idle -> busy after 2 s: not a period
    assert not p.learned
    p.observe(grid(T0 + 30_000_000, 8, P_US, 90.0))
    assert math.isclose(p.seconds, P_S * 1.1, rel_tol=0.01)
    p.observe(grid(T0 + 60_000_000, 8, 900_000, 90.0))  # later spacings never lengthen it
    assert math.isclose(p.seconds, P_S * 1.1, rel_tol=0.01)


def test_a_stop_between_two_bursts_is_not_a_period() -> None:
    # A burst's last sample (2 %, the tail of its work) and the next burst's first (33 %) are both
    # busy, 9.3 s apart: the driver stopped sampling in between; no product samples that seldom.
    p = SamplePeriod()
    p.observe([(T0, 2.0), (T0 + 9_333_333, 33.0)])
    assert not p.learned and p.seconds == PERIOD_MIN_S
    p.observe([(T0, 50.0), (T0 + 1_050_000, 50.0)])  # 1.05 s: a once-a-second product, with jitter
    assert p.learned and math.isclose(p.seconds, PERIOD_MAX_S * 1.1)  # the documented ceiling


@settings(max_examples=50)
@given(st.integers(30_000, 2_000_000), st.integers(-3_000, 3_000))
def test_learned_period_stays_in_the_documented_range(spacing, jitter) -> None:
    p = SamplePeriod()
    p.observe([(T0 + k * spacing + (jitter if k % 2 else 0), 50.0) for k in range(10)])
    assert PERIOD_MIN_S <= p.seconds <= PERIOD_MAX_S * 1.1
