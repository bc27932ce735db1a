"""Value trends over simulated weeks in a real ledger (SQLite and PostgreSQL): a batch-size change
makes the GPU wait for data, the cost per mAP point rises, and the report names the cause."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpuledger.core.chargeback.anomaly_rule import AnomalyRule
from gpuledger.core.chargeback.value_trends import week_label
from gpuledger.reports.cost.value_trends import run_values, value_trends
from gpuledger.store import Ledger
from value_sim import CARD, REPORT_END, WEEKS, expected, simulate, write


@pytest.fixture
def sim_ledger(ledger_url: str):
    runs = simulate()
    with Ledger(ledger_url) as ledger:
        write(ledger, runs)
        yield ledger, runs


def test_weekly_figures_match_the_simulation_computed_apart(sim_ledger) -> None:
    ledger, runs = sim_ledger
    trends = value_trends(ledger, scope=None, card=CARD, end=REPORT_END, weeks=5)
    assert [week_label(w) for w in trends.weeks] == ["2026-W09", "2026-W10", "2026-W11", "2026-W12", "2026-W13"]
    truth = expected(runs)
    rows = {(r["model_version"], r["week"]): r for r in trends.series}
    assert len(rows) == len(truth) == 10
    for (group, week), want in truth.items():
        row = rows[(group, week_label(week))]
        assert row["runs"] == len(want.runs)
        # Held time is counted in micro-GPU-hours (3.6 ms), once per run, GPU and day: ± 0.5 µh each.
        assert float(row["cost"]) == pytest.approx(want.cost, abs=len(want.runs) * 2 * 0.5e-6 * 3.43)
        assert row["map_points"] == pytest.approx(want.points, abs=1e-9)
        assert float(row["cost_per_map_point"]) == pytest.approx(want.per_point, abs=1e-6)  # 6 places
        assert row["cost_per_epoch"] == format(Decimal(row["cost"]) / row["epochs"], ".6f")
    # The resumed training counts its mAP once: 20 points for the crashed attempt, 15 for the resume.
    v11n = rows[("yolo11n", "2026-W10")]
    assert v11n["map_points"] == pytest.approx(4 * 35.0) and v11n["failed_runs"] == 1
    assert v11n["epochs"] == 40 and v11n["images_seen"] == 40 * 5000


def test_the_batch_change_is_flagged_with_its_cause(sim_ledger) -> None:
    ledger, runs = sim_ledger
    trends = value_trends(ledger, scope=None, card=CARD, end=REPORT_END, weeks=5)
    flagged = {(a.group, a.metric): a for a in trends.anomalies}
    assert {g for g, _ in flagged} == {"yolov5m"}  # yolo11n did not change
    a = flagged[("yolov5m", "cost_per_map_point")]
    truth = expected(runs)
    before = truth[("yolov5m", WEEKS[0])].per_point
    now = truth[("yolov5m", WEEKS[-1])].per_point
    assert float(a.change) == pytest.approx(now / before - 1, abs=1e-5)  # 11.43 / 38 over 6.86 / 40: +75 %
    assert a.message.startswith(
        f"cost per mAP point of yolov5m runs rose {round((now / before - 1) * 100)} % last week (2026-W13): "
    )
    assert "likely cause: utilisation fell from 81 % to 45 % after batch changed 64 → 16" in a.message
    assert "input-pipeline bound in 4 of 4 runs (0 of 16 before)" in a.message
    assert "workers changed" not in a.message and "gpu_model changed" not in a.message
    assert {c.kind for c in a.causes} >= {"setting_changed", "utilisation_fell", "finding"}
    # The same week and cause for cost per epoch: 10 epochs cost more.
    assert "batch changed 64 → 16" in flagged[("yolov5m", "cost_per_epoch")].message
    # The JSON twin carries the message, the causes and the rule that flagged them.
    doc = trends.as_dict()
    assert doc["anomaly_rule"]["baseline_weeks"] == 4 and doc["anomalies"][0]["message"] == trends.anomalies[0].message


def test_a_stricter_rule_or_a_narrower_scope_flags_nothing(sim_ledger) -> None:
    ledger, _ = sim_ledger
    strict = value_trends(ledger, scope=None, card=CARD, end=REPORT_END, weeks=5, rule=AnomalyRule(min_change=1.0))
    assert strict.anomalies == []
    other = value_trends(ledger, scope=frozenset({"someone-else"}), card=CARD, end=REPORT_END, weeks=5)
    assert other.series == [] and other.runs == 0


def test_run_values_read_the_settings_and_gains(sim_ledger) -> None:
    ledger, _ = sim_ledger
    values = {v.run_id: v for v in run_values(ledger, scope=None, card=CARD, start=WEEKS[0], end=REPORT_END)}
    assert values["v5m-4-0"].settings == {
        "batch": 16,
        "imgsz": 640,
        "workers": 8,
        "gpu_model": "A100-80GB-SXM",
        "dataset": "parts",
    }
    assert values["v11n-1-0b"].map_points == Decimal("15.0") and values["v11n-1-0a"].map_points == Decimal("20.0")
    assert values["v5m-0-0"].busy_uh == 1_620_000 and values["v5m-0-0"].measured_uh == 2_000_000


def test_nan_metrics_imported_and_open_runs_do_not_count(sim_ledger) -> None:
    from gpuledger.core.model import Metric, RunRecord

    ledger, _ = sim_ledger
    # A NaN mAP (a diverged validation) is no result: the best finite value stays the run's best.
    ledger.append("v5m-0-0", metrics=[Metric(WEEKS[0] + 86400 + 7000, "metrics/mAP50-95(B)", float("nan"), 11)])
    labels = {"project": "detector", "model": "yolov5m", "model_version": "yolov5m"}
    for rid, status, ended in (("imported-1", "imported", WEEKS[0] + 90000), ("open-1", "running", None)):
        ledger.create_run(
            RunRecord(
                id=rid,
                command=["yolo"],
                user="ana",
                host="h",
                cwd="/",
                started_at=WEEKS[0],
                status=status,
                ended_at=ended,
                labels=labels,
            )
        )
        ledger.append(rid, metrics=[Metric(WEEKS[0] + 100, "metrics/mAP50-95(B)", 0.9, 1)])
    values = {v.run_id: v for v in run_values(ledger, scope=None, card=CARD, start=WEEKS[0], end=REPORT_END)}
    assert values["v5m-0-0"].map_points == Decimal("40.0") and values["v5m-0-0"].epochs == 11
    assert "imported-1" not in values and "open-1" not in values
