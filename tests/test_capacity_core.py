"""The capacity states' arithmetic (core/capacity/model.py): every reading in exactly one state, parts that
add up exactly whatever the cut. Property tests, with the expectations computed here."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.core.capacity.meter import CapacityMeter, GpuFacts
from gpuledger.core.capacity.model import (
    DAY_MS,
    MAX_GPU_POWER_W,
    CapacityInterval,
    Reading,
    States,
    apportion,
    classify,
    merge_days,
    split_days,
    to_uh,
    uh_of,
)

readings = st.builds(
    Reading,
    span_ms=st.integers(0, 10**7),
    busy_ms=st.none() | st.integers(-5, 2 * 10**7),
    held=st.booleans(),
    in_use=st.booleans(),
    attributed=st.booleans(),
    unknown_ms=st.integers(0, 10**7),
)


@given(readings)
def test_a_reading_is_split_into_states_that_add_up_to_its_span(r: Reading) -> None:
    s = classify(r)
    assert min(s.as_tuple()) >= 0
    assert s.total_ms == r.span_ms


@given(readings)
def test_each_state_means_what_the_docs_say(r: Reading) -> None:
    s = classify(r)
    unknown = r.unknown_ms if r.in_use else 0  # samples lost: busy while a process is on it, like unmeasured
    busy = (r.span_ms if r.in_use else 0) if r.busy_ms is None else min(r.span_ms, max(0, r.busy_ms) + unknown)
    assert s.busy_ms == busy  # busy is the driver's figure, or "a process is on it" when unmeasured
    if not (r.held or r.attributed):  # nobody held it: never allocated
        assert s.alloc_idle_ms == 0 and s.busy_attr_ms == 0
        assert s.unallocated_ms == r.span_ms - busy
    else:
        assert s.unallocated_ms == 0
        assert s.alloc_idle_ms == r.span_ms - busy
    if not r.attributed:  # nobody found on it: its busy time has no owner
        assert s.busy_attr_ms == 0


def test_a_pod_given_a_gpu_it_never_touches_leaves_it_allocated_idle() -> None:
    assert classify(Reading(2000, 0, held=True, in_use=False, attributed=False)) == States(alloc_idle_ms=2000)


def test_work_with_no_process_found_is_busy_unattributed_even_on_a_free_gpu() -> None:
    s = classify(Reading(2000, 1500, held=False, in_use=False, attributed=False))
    assert s == States(unallocated_ms=500, busy_unattr_ms=1500)


def test_an_owned_process_holds_the_gpu_and_its_busy_time_is_attributed() -> None:
    s = classify(Reading(2000, 1200, held=False, in_use=True, attributed=True))
    assert s == States(alloc_idle_ms=800, busy_attr_ms=1200)


def test_an_unmeasured_gpu_is_busy_while_a_process_is_on_it() -> None:
    assert classify(Reading(2000, None, held=True, in_use=True, attributed=True)) == States(busy_attr_ms=2000)
    assert classify(Reading(2000, None, held=True, in_use=False, attributed=False)) == States(alloc_idle_ms=2000)


@given(st.integers(0, 10**15), st.lists(st.integers(0, 10**9), min_size=1, max_size=8))
def test_apportion_adds_up_and_stays_within_one_of_the_exact_share(total: int, weights: list[int]) -> None:
    parts = apportion(total, weights)
    assert sum(parts) == total
    whole = sum(weights)
    if whole:
        for part, w in zip(parts, weights, strict=True):
            assert abs(Fraction(part) - Fraction(total * w, whole)) < 1


states = st.lists(st.integers(0, 3 * DAY_MS), min_size=4, max_size=4)


@given(
    st.integers(20_000 * DAY_MS, 20_010 * DAY_MS),
    states,
    st.integers(0, 100),
    st.none() | st.floats(0, 1, allow_nan=False),  # mean power as a share of the most a GPU draws
)
def test_an_interval_split_at_midnights_keeps_every_millisecond(
    t0: int, parts: list[int], unmeasured_pct: int, power: float | None
) -> None:
    span = sum(parts)
    energy = None if power is None else power * MAX_GPU_POWER_W * span / 1000
    iv = CapacityInterval("GPU-x", "h", t0, t0 + span, States(*parts), span * unmeasured_pct // 100, energy)
    iv.check()
    days = split_days(iv)
    for d in days:  # each day part: its states fill exactly its stretch of the day
        assert (d.first_ms // DAY_MS == d.day and (d.last_ms - 1) // DAY_MS == d.day) or d.first_ms == d.last_ms
        assert d.states.total_ms == d.last_ms - d.first_ms
        assert 0 <= d.unmeasured_ms <= d.span_ms
        assert min(d.states.as_tuple()) >= 0
    total = States()
    for d in days:
        total = total + d.states
    assert total == iv.states  # and every state's parts add up to the interval's figure
    assert sum(d.unmeasured_ms for d in days) == iv.unmeasured_ms
    assert sum(d.intervals for d in days) == 1
    if energy is not None:
        assert sum(d.energy_j or 0.0 for d in days) == pytest.approx(energy, rel=1e-9, abs=1e-6)
    merged = merge_days(days + days)
    assert sum(d.span_ms for d in merged) == 2 * span


def test_an_interval_across_midnight_is_cut_there_in_proportion() -> None:
    midnight = 20_100 * DAY_MS
    iv = CapacityInterval("GPU-x", "h", midnight - 4000, midnight + 6000, States(0, 5000, 5000, 0), 0, 100.0)
    before, after = split_days(iv)
    assert (before.day, before.first_ms, before.last_ms) == (20_099, midnight - 4000, midnight)
    assert before.states == States(0, 2000, 2000, 0) and after.states == States(0, 3000, 3000, 0)
    assert (before.energy_j, after.energy_j) == (pytest.approx(40.0), pytest.approx(60.0))


@given(st.lists(st.integers(0, 10**10), min_size=1, max_size=6))
def test_milliseconds_become_micro_hours_that_add_up_to_the_span(parts: list[int]) -> None:
    uh = to_uh(parts)
    assert sum(uh) == uh_of(sum(parts))
    assert abs(Fraction(uh_of(sum(parts))) - Fraction(sum(parts), Fraction(36, 10))) <= Fraction(1, 2)


def test_a_whole_day_is_24_gpu_hours() -> None:
    assert uh_of(DAY_MS) == 24_000_000


def test_a_broken_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="add up"):
        CapacityInterval("GPU-x", "h", 0, 1000, States(500, 0, 0, 0)).check()
    with pytest.raises(ValueError, match="before"):
        CapacityInterval("GPU-x", "h", 1000, 0, States()).check()
    with pytest.raises(ValueError, match="more than any GPU draws"):  # 6 kJ in one second
        CapacityInterval("GPU-x", "h", 0, 1000, States(1000, 0, 0, 0), 0, 6000.0).check()
    CapacityInterval("GPU-x", "h", 0, 1000, States(1000, 0, 0, 0), 0, 1200.0).check()  # a 1.2 kW part: fine


def test_an_energy_reading_no_gpu_can_reach_is_kept_as_unmeasured_by_the_agent() -> None:
    # A broken counter delta must neither stop the agent's write (the interval would be refused)
    # nor reach the report: the interval keeps its states, its energy is unmeasured.
    meter = CapacityMeter("h")
    meter.add(0.0, 10.0, {"GPU-a": GpuFacts(busy_s=5.0, held=True, in_use=True, attributed=True, energy_j=1e20)})
    meter.add(10.0, 20.0, {"GPU-b": GpuFacts(busy_s=5.0, held=True, in_use=True, attributed=True, energy_j=3000.0)})
    out, _ = meter.close()
    for iv in out:
        iv.check()
    assert {iv.gpu_uuid: iv.energy_j for iv in out} == {"GPU-a": None, "GPU-b": 3000.0}


def test_a_reading_that_starts_before_the_previous_one_ended_counts_only_the_new_time() -> None:
    # The wall clock stepped back 30 s, or a reading failed after it was metered: the next reading
    # claims [-8, 30). The 20 s already in an interval must not be counted twice.
    meter = CapacityMeter("h")
    facts = {"GPU-a": GpuFacts(busy_s=None, energy_j=None, held=True, in_use=False, attributed=False)}
    meter.add(2.0, 10.0, facts)
    meter.add(10.0, 20.0, facts)
    meter.add(-8.0, 30.0, facts)
    meter.add(25.0, 28.0, facts)  # wholly inside what is counted: nothing new
    out, _ = meter.close()
    spans = sorted((iv.t0_ms, iv.t1_ms) for iv in out)
    assert spans == [(2000, 30000)]
    assert sum(iv.states.total_ms for iv in out) == 28_000


def test_busy_time_the_samples_could_not_cover_is_unmeasured_and_busy_while_a_process_is_on_the_gpu() -> None:
    # A 20 s reading whose samples cover 5 s busy and 15 s lost (no instant reading to measure them).
    meter = CapacityMeter("h")
    busy = GpuFacts(busy_s=5.0, energy_j=None, held=True, in_use=True, attributed=True, unknown_s=15.0)
    free = GpuFacts(busy_s=0.0, energy_j=None, held=False, in_use=False, attributed=False, unknown_s=15.0)
    meter.add(0.0, 20.0, {"GPU-busy": busy, "GPU-free": free})
    out, _ = meter.close()
    got = {iv.gpu_uuid: (iv.states, iv.unmeasured_ms) for iv in out}
    assert got["GPU-busy"] == (States(alloc_idle_ms=0, busy_attr_ms=20_000), 15_000)
    assert got["GPU-free"] == (States(unallocated_ms=20_000), 15_000)
