"""core/chargeback/anomaly_rule.py: the last week against the median of the weeks before (figures by hand)."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_support import ts
from gpuledger.core.chargeback.anomaly_rule import AnomalyRule, find_anomalies
from gpuledger.core.chargeback.value_trends import WEEK_S, RunValue, weekly_cells
from gpuledger.core.money import MONEY_SCALE

W0 = ts("2026-02-02")  # a Monday
WEEKS = [W0 + k * WEEK_S for k in range(5)]


def week_of_runs(week: float, per_point: str, n: int = 3, group: str = "yolov5m") -> list[RunValue]:
    """``n`` runs of 10 mAP points each costing ``per_point`` per point."""
    cost = int(Decimal(per_point).scaleb(MONEY_SCALE) * 10)
    return [
        RunValue(
            f"{group}-{week}-{i}",
            week + 3600 * (i + 1),
            "succeeded",
            group,
            None,
            cost=cost,
            map_points=Decimal(10),
            epochs=10,
        )
        for i in range(n)
    ]


def cells_for(per_week: list[str | None], n: int = 3, current_n: int | None = None):  # type: ignore[no-untyped-def]
    runs = []
    for k, figure in enumerate(per_week):
        if figure is not None:
            runs += week_of_runs(WEEKS[k], figure, current_n if (k == len(per_week) - 1 and current_n) else n)
    return weekly_cells(runs, WEEKS)


def test_cost_per_map_point_rose_35_percent_over_the_median() -> None:
    found = find_anomalies(cells_for(["1.00", "1.10", "0.90", "1.00", "1.35"]), WEEKS)
    by_metric = {a.metric: a for a in found}
    a = by_metric["cost_per_map_point"]
    assert (a.group, a.week, a.baseline, a.current, a.change) == (
        "yolov5m",
        WEEKS[4],
        Decimal("1.000000"),
        Decimal("1.350000"),
        Decimal("0.350000"),
    )
    assert a.baseline_weeks == WEEKS[:4]
    # Per epoch the runs are the same runs: 10 epochs for 10 points, so the same change.
    assert by_metric["cost_per_epoch"].change == Decimal("0.350000")
    assert "cost_per_1k_images" not in by_metric  # no image counts: no figure, no anomaly


def test_median_not_mean_one_odd_week_does_not_hide_a_rise() -> None:
    # Mean of the baseline 1.75 would hide 1.30; the median 1.00 shows it (+30 %).
    found = find_anomalies(cells_for(["1.00", "1.00", "4.00", "1.00", "1.30"]), WEEKS)
    assert [a.change for a in found if a.metric == "cost_per_map_point"] == [Decimal("0.300000")]


@pytest.mark.parametrize(
    ("per_week", "n", "current_n", "rule", "flagged"),
    [
        (["1.00", "1.00", "1.00", "1.00", "1.25"], 3, None, AnomalyRule(), True),  # exactly +25 %: flagged
        (["1.00", "1.00", "1.00", "1.00", "1.24"], 3, None, AnomalyRule(), False),  # +24 %: not
        (["1.00", "1.00", "1.00", "1.00", "2.00"], 3, 2, AnomalyRule(), False),  # 2 runs in the week: too few
        (["1.00", "1.00", "1.00", "1.00", "2.00"], 3, 2, AnomalyRule(min_runs=2), True),
        ([None, None, None, "1.00", "2.00"], 3, None, AnomalyRule(), False),  # one baseline week only
        ([None, None, "1.00", "1.00", "2.00"], 3, None, AnomalyRule(), True),  # two: enough
        (["1.00", "1.00", "1.00", "1.00", "2.00"], 2, 3, AnomalyRule(), False),  # baseline weeks of 2 runs don't count
        (["1.00", "1.00", "1.00", "1.00", "0.50"], 3, None, AnomalyRule(), False),  # cheaper is no anomaly
        (["1.00", "1.00", "1.00", "1.00", None], 3, None, AnomalyRule(), False),  # nothing last week
    ],
)
def test_rule_thresholds(per_week, n, current_n, rule, flagged) -> None:  # type: ignore[no-untyped-def]
    found = [
        a for a in find_anomalies(cells_for(per_week, n, current_n), WEEKS, rule) if a.metric == "cost_per_map_point"
    ]
    assert bool(found) is flagged


def test_only_the_baseline_weeks_before_the_last_count() -> None:
    # baseline_weeks=2: the weeks 2 and 3 (1.00) count, not the dear weeks 0 and 1.
    found = find_anomalies(cells_for(["9.00", "9.00", "1.00", "1.00", "1.50"]), WEEKS, AnomalyRule(baseline_weeks=2))
    assert found and all(a.baseline_weeks == WEEKS[2:4] for a in found)


def test_rule_refuses_impossible_settings() -> None:
    with pytest.raises(ValueError, match="min_baseline_weeks"):
        AnomalyRule(baseline_weeks=2, min_baseline_weeks=3)
    with pytest.raises(ValueError, match="min_change"):
        AnomalyRule(min_change=0)
    with pytest.raises(ValueError, match="unknown value metrics: cost_per_gpu"):
        AnomalyRule(metrics=("cost_per_gpu",))


@settings(max_examples=150)
@given(
    st.lists(st.integers(min_value=50, max_value=500), min_size=5, max_size=5),
    st.integers(min_value=1, max_value=1000),
)
def test_change_is_relative_to_the_median_and_independent_of_the_currency_scale(cents, scale) -> None:  # type: ignore[no-untyped-def]
    figures = [f"{c / 100:.2f}" for c in cents]
    scaled = [f"{c * scale / 100:.2f}" for c in cents]
    a = [(x.metric, x.change) for x in find_anomalies(cells_for(figures), WEEKS)]
    b = [(x.metric, x.change) for x in find_anomalies(cells_for(scaled), WEEKS)]
    assert a == b  # a price list in yen or dollars flags the same weeks
    baseline = sorted(Decimal(f) for f in figures[:4])
    median = (baseline[1] + baseline[2]) / 2
    expected = ((Decimal(figures[4]) - median) / median).quantize(Decimal("0.000001"), ROUND_HALF_EVEN)
    flagged = dict(a).get("cost_per_map_point")
    if expected >= Decimal("0.25"):
        assert flagged == expected
    else:
        assert flagged is None
