"""GPU usage over an evaluation window (core/evaluation/window.py): properties of the arithmetic."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.core.evaluation.window import MIN_BUSY_WINDOW_S, window_usage
from gpuledger.core.model import GpuInterval

POWER = st.floats(min_value=0.0, max_value=1000.0, allow_nan=False)
LENGTH = st.floats(min_value=0.01, max_value=30.0, allow_nan=False)


def _intervals(lengths: list[float], powers: list[float], uuid: str = "GPU-a", busy: float = 0.5) -> list[GpuInterval]:
    """Back-to-back intervals from t=0, each at a constant power (energy = power × length)."""
    out, t = [], 0.0
    for i, (length, power) in enumerate(zip(lengths, powers, strict=False)):
        out.append(
            GpuInterval(uuid, i, t, t + length, energy_j=power * length, busy_s=busy * length, power_max_w=power)
        )
        t += length
    return out


def _exact(ivs: list[GpuInterval], t0: float, t1: float) -> float:
    """∫ power dt over [t0, t1] for stepped power, computed directly."""
    return sum((iv.energy_j or 0.0) / (iv.t1 - iv.t0) * max(0.0, min(iv.t1, t1) - max(iv.t0, t0)) for iv in ivs)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(LENGTH, POWER), min_size=1, max_size=12), st.floats(0, 1), st.floats(0, 1))
def test_energy_is_the_integral_of_stepped_power_over_the_window(steps, a: float, b: float) -> None:
    ivs = _intervals([s[0] for s in steps], [s[1] for s in steps])
    end = ivs[-1].t1
    t0, t1 = sorted((a * end, b * end))
    usage = window_usage(ivs, t0, t1)
    if t1 - t0 <= 0:
        return
    assert usage.energy_j is not None
    assert math.isclose(usage.energy_j, _exact(ivs, t0, t1), rel_tol=1e-9, abs_tol=1e-6)
    if t1 - t0 >= MIN_BUSY_WINDOW_S:
        assert math.isclose(usage.busy_share or 0.0, 0.5, rel_tol=1e-9)
    else:  # shorter than a sample period can place: not measured, never a guess
        assert usage.busy_s is None and usage.busy_share is None
    assert usage.power_mean_w is not None and usage.power_mean_w <= max(s[1] for s in steps) + 1e-6


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(LENGTH, POWER), min_size=1, max_size=12), st.floats(0.01, 0.99))
def test_adjacent_windows_add_up_and_the_whole_run_is_the_total(steps, cut: float) -> None:
    ivs = _intervals([s[0] for s in steps], [s[1] for s in steps])
    end = ivs[-1].t1
    whole = window_usage(ivs, 0.0, end)
    left, right = window_usage(ivs, 0.0, cut * end), window_usage(ivs, cut * end, end)
    total = sum(iv.energy_j or 0.0 for iv in ivs)
    assert whole.energy_j is not None and left.energy_j is not None and right.energy_j is not None
    assert math.isclose(whole.energy_j, total, rel_tol=1e-9, abs_tol=1e-6)
    assert math.isclose(left.energy_j + right.energy_j, total, rel_tol=1e-9, abs_tol=1e-6)


def test_two_gpus_add_up_and_per_image() -> None:
    ivs = _intervals([10.0], [100.0], "GPU-a", busy=1.0) + _intervals([10.0], [300.0], "GPU-b", busy=0.0)
    usage = window_usage(ivs, 2.0, 7.0)
    assert usage.gpus == 2
    assert usage.energy_j == 5 * 100 + 5 * 300
    assert usage.power_mean_w == 400.0  # both GPUs together
    assert usage.power_peak_w == 300.0  # the highest one GPU drew
    assert usage.busy_share == 0.5  # 5 busy seconds of 10 GPU-seconds
    assert usage.per_image_j(40) == 50.0 and usage.per_image_j(None) is None


def test_absent_is_not_zero() -> None:
    ivs = _intervals([5.0, 5.0], [100.0, 100.0])
    ivs[1].energy_j = None  # the counter was not read in the second interval
    assert window_usage(ivs, 1.0, 9.0).energy_j is None
    assert window_usage(ivs, 1.0, 4.0).energy_j == 300.0  # a window the gap does not touch
    full = _intervals([5.0, 5.0], [100.0, 100.0])
    assert window_usage(full, 8.0, 12.0).energy_j is None  # the intervals end at 10: not covered
    assert window_usage(full, 8.0, 10.0).energy_j == 200.0
    assert window_usage([], 0.0, 1.0).energy_j is None
    assert window_usage([], 0.0, 1.0).busy_share is None


def test_a_short_window_has_energy_but_no_busy_share() -> None:
    ivs = _intervals([0.5, 0.03, 0.5], [100.0, 100.0, 100.0], busy=0.4)
    ivs[1].busy_s = 0.03 * 2.0  # what a cut inside one sample period can hold: a period's samples
    usage = window_usage(ivs, 0.5, 0.53)
    assert usage.energy_j is not None and math.isclose(usage.energy_j, 3.0)
    assert usage.busy_s is None and usage.busy_share is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(LENGTH, st.floats(0.0, 1.0)), min_size=1, max_size=12), st.floats(0, 1), st.floats(0, 1))
def test_unmeasured_time_is_left_out_of_the_share(steps, a: float, b: float) -> None:
    """Each interval busy 50 % of the time it measured, the rest of it (a share) unmeasured:
    the share over any window is 50 %, not 50 % diluted by the unmeasured seconds."""
    ivs = _intervals([s[0] for s in steps], [100.0] * len(steps), busy=0.0)
    for iv, (length, lost) in zip(ivs, steps, strict=True):
        iv.util_unmeasured_s = lost * length
        iv.busy_s = 0.5 * (length - lost * length)
    end = ivs[-1].t1
    t0, t1 = sorted((a * end, b * end))
    usage = window_usage(ivs, t0, t1)
    expected_unmeasured = sum(iv.util_unmeasured_s * max(0.0, min(iv.t1, t1) - max(iv.t0, t0)) / (iv.t1 - iv.t0)
                              for iv in ivs)  # fmt: skip
    assert math.isclose(usage.unmeasured_s, expected_unmeasured, rel_tol=1e-9, abs_tol=1e-9)
    if t1 - t0 < MIN_BUSY_WINDOW_S:
        assert usage.busy_share is None
    elif (t1 - t0) - usage.unmeasured_s > 1e-6:
        assert math.isclose(usage.busy_share or 0.0, 0.5, rel_tol=1e-6)
