"""core/chargeback/value_trends.py: weeks, mAP points gained, weekly sums and ratios, TOP lists (figures by hand)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_support import ts
from gpuledger.core.chargeback.value_trends import (
    WEEK_S,
    Cell,
    RunValue,
    group_of,
    map_gain_points,
    series_rows,
    top_lists,
    week_label,
    week_start,
    weekly_cells,
    weeks_before,
)
from gpuledger.core.money import MONEY_SCALE, money_decimal

W10 = ts("2026-03-02")  # Monday of ISO week 2026-W10


def units(amount: str) -> int:
    return int(Decimal(amount).scaleb(MONEY_SCALE))


def run(rid: str, ended: float, cost: str, **kw) -> RunValue:
    kw.setdefault("model_version", "yolov5m")
    kw.setdefault("status", "succeeded")
    return RunValue(run_id=rid, ended_at=ended, model=kw.pop("model", "yolov5m"), cost=units(cost), **kw)


def test_weeks_are_iso_weeks_starting_monday_utc() -> None:
    assert week_start(ts("2026-03-04T15:30")) == W10
    assert week_start(W10) == W10 and week_start(W10 - 1) == W10 - WEEK_S
    assert week_label(W10) == "2026-W10"
    assert week_label(ts("2025-12-29")) == "2026-W01"  # ISO year, not the calendar year
    # A report ending on a Wednesday: last week is its last complete week.
    assert weeks_before(ts("2026-03-04T12:00"), 3) == [ts("2026-02-09"), ts("2026-02-16"), ts("2026-02-23")]
    # Ending exactly on a Monday 00:00: the week that just ended counts.
    assert weeks_before(W10, 1) == [ts("2026-02-23")]


def test_map_points_gained_by_an_attempt() -> None:
    assert map_gain_points(0.412, None) == Decimal("41.2")
    assert map_gain_points(0.45, 0.412) == Decimal("3.8")  # a resumed attempt adds what it improved
    assert map_gain_points(0.40, 0.412) == 0  # a worse attempt gains nothing, never a negative
    assert map_gain_points(float("nan"), 0.3) == 0 and map_gain_points(None, None) == 0


@given(st.lists(st.floats(min_value=0, max_value=1), min_size=1, max_size=6))
def test_gains_of_a_chain_add_up_to_its_best(bests: list[float]) -> None:
    gained, best_before = Decimal(0), None
    for b in bests:
        gained += map_gain_points(b, best_before)
        best_before = b if best_before is None else max(best_before, b)
    assert gained == Decimal(repr(max(bests))) * 100 if max(bests) > 0 else gained == 0


def test_a_week_figures_are_ratios_of_sums() -> None:
    # 41.20 spent on three runs; the failed one produced nothing but its cost counts.
    runs = [
        run("a", W10 + 3600, "10.00", epochs=10, images_seen=10_000, map_points=Decimal("20")),
        run("b", W10 + 7200, "20.00", epochs=20, images_seen=20_000, map_points=Decimal("21.2")),
        run("c", W10 + 9000, "11.20", status="failed"),
    ]
    cells = weekly_cells(runs, [W10])
    cell = cells[("yolov5m", W10)]
    assert (cell.runs, cell.failed, cell.epochs) == (3, 1, 30)
    assert cell.metric("cost_per_map_point") == Decimal("1.000000")  # 41.20 / 41.2 points
    assert cell.metric("cost_per_epoch") == Decimal("1.373333")  # 41.20 / 30, half-even to 6 places
    assert cell.metric("cost_per_1k_images") == Decimal("1.373333")  # 41.20 / 30 thousand images
    row = series_rows(cells, [W10], "model_version")[0]
    assert row["model_version"] == "yolov5m" and row["week"] == "2026-W10"
    assert row["cost"] == "41.20" and row["cost_per_map_point"] == "1.000000" and row["failed_runs"] == 1


def test_figures_without_a_divisor_are_empty_not_zero() -> None:
    cell = Cell()
    cell.add(run("a", W10, "5.00"))
    assert cell.metric("cost_per_map_point") is None and cell.metric("cost_per_epoch") is None
    assert cell.busy_share() is None
    assert cell.columns()["cost_per_1k_images"] is None


def test_busy_share_is_busy_over_measured_gpu_time() -> None:
    cell = Cell()
    cell.add(run("a", W10, "1.00", busy_uh=810_000, measured_uh=1_000_000, alloc_uh=1_500_000))
    cell.add(run("b", W10, "1.00", busy_uh=0, measured_uh=0, alloc_uh=500_000))  # a MIG slice: unmeasured
    assert cell.busy_share() == 0.81


def test_runs_group_by_model_version_then_model_and_fall_outside_the_weeks() -> None:
    runs = [
        run("a", W10, "1.00"),
        run("b", W10, "2.00", model_version=None, model="yolo11n"),  # only the automatic label
        run("c", W10, "4.00", model_version=None, model=None),  # no group: not a model run
        run("d", W10 - 1, "8.00"),  # the week before: outside
    ]
    cells = weekly_cells(runs, [W10])
    assert {g: money_decimal(c.cost) for (g, _), c in cells.items()} == {"yolov5m": 1, "yolo11n": 2}
    assert group_of(runs[1], "model") == "yolo11n"
    with pytest.raises(ValueError, match="model_version, model"):
        group_of(runs[0], "team")


def test_top_lists_rank_cost_cost_per_map_point_and_idle_cost() -> None:
    runs = [
        run("a", W10, "30.00", model_version="m-cheap", map_points=Decimal(60), idle_cost=units("1.00")),
        run("b", W10, "20.00", model_version="m-dear", map_points=Decimal(10), idle_cost=units("9.00")),
        run("c", W10 - WEEK_S, "25.00", model_version="m-dear", map_points=Decimal(5)),
        run("d", W10, "2.00", model_version="m-none"),  # no mAP: not in the cost-per-point list
    ]
    tops = top_lists(weekly_cells(runs, [W10 - WEEK_S, W10]), "model_version", n=2)
    assert [r["model_version"] for r in tops["top_by_cost"]] == ["m-dear", "m-cheap"]  # 45 over both weeks
    assert tops["top_by_cost"][0]["cost"] == "45.00" and tops["top_by_cost"][0]["rank"] == 1
    assert [r["model_version"] for r in tops["top_by_cost_per_map_point"]] == ["m-dear", "m-cheap"]
    assert tops["top_by_cost_per_map_point"][0]["cost_per_map_point"] == "3.000000"  # 45 / 15 points
    assert [r["model_version"] for r in tops["top_by_idle_cost"]] == ["m-dear", "m-cheap"]


money = st.integers(min_value=0, max_value=10**24)  # up to 1,000 currency units, in 10^-21
points = st.decimals(min_value=0, max_value=100, places=4)


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(st.sampled_from(["m1", "m2", "m3"]), st.integers(0, 3), money, points, st.integers(0, 300)),
        max_size=30,
    )
)
def test_cells_add_up_exactly_and_ratios_round_half_even(items) -> None:  # type: ignore[no-untyped-def]
    weeks = [W10 + k * WEEK_S for k in range(4)]
    runs = [
        RunValue(f"r{i}", weeks[w] + 60, "succeeded", None, g, cost=c, map_points=p, epochs=e)
        for i, (g, w, c, p, e) in enumerate(items)
    ]
    cells = weekly_cells(runs, weeks)
    assert sum(c.cost for c in cells.values()) == sum(r.cost for r in runs)
    assert sum(c.runs for c in cells.values()) == len(runs)
    for cell in cells.values():
        per_point = cell.metric("cost_per_map_point")
        if cell.map_points > 0:
            exact = money_decimal(cell.cost) / cell.map_points
            assert abs(per_point - exact) <= Decimal("0.0000005")
        else:
            assert per_point is None
    # The TOP list by cost holds every group that cost something (3 groups, n=3): its costs add up.
    ranked = top_lists(cells, "model_version", 3)["top_by_cost"]
    assert sum(Decimal(r["cost"]) for r in ranked) == money_decimal(sum(r.cost for r in runs))
