"""core/chargeback/anomaly_causes.py: each likely cause at its threshold, and the message they make."""

from __future__ import annotations

from decimal import Decimal

import pytest

from cost_support import ts
from gpuledger.core.chargeback.anomaly_causes import (
    CauseThresholds,
    causes_of,
    explain,
    finding,
    map_fell,
    more_failures,
    price_rose,
    setting_changed,
    utilisation_fell,
)
from gpuledger.core.chargeback.anomaly_rule import Anomaly
from gpuledger.core.chargeback.value_trends import WEEK_S, RunValue
from gpuledger.core.money import MONEY_SCALE

W = ts("2026-03-02")
TH = CauseThresholds()


def rv(
    i: int,
    *,
    busy: float = 0.8,
    batch: int | None = 64,
    status: str = "succeeded",
    cost: str = "10",
    held_h: int = 4,
    points: str = "40",
    findings: tuple[str, ...] = (),
    diagnosed: bool = True,
    **settings,
) -> RunValue:
    held = held_h * 1_000_000
    return RunValue(
        f"r{i}",
        W + i,
        status,
        "yolov5m",
        None,
        cost=int(Decimal(cost).scaleb(MONEY_SCALE)),
        alloc_uh=held,
        measured_uh=held,
        busy_uh=round(held * busy),
        map_points=Decimal(points),
        settings={"batch": batch, **settings},
        findings=frozenset(findings),
        diagnosed=diagnosed,
    )


def test_utilisation_fell_by_ten_points_or_more() -> None:
    before = [rv(i, busy=0.81) for i in range(4)]
    cause = utilisation_fell([rv(9, busy=0.52)], before, TH)
    assert cause is not None and cause.text == "utilisation fell from 81 % to 52 %"
    assert utilisation_fell([rv(9, busy=0.72)], before, TH) is None  # 9 points: below the threshold
    assert utilisation_fell([rv(9, busy=0.71)], before, TH) is not None  # 10 points
    assert utilisation_fell([rv(9, busy=0.2)], [], TH) is None  # nothing to compare with


def test_setting_changed_compares_the_most_common_values() -> None:
    before = [rv(i, batch=64) for i in range(5)] + [rv(7, batch=32)]
    cause = setting_changed("batch")([rv(9, batch=16), rv(10, batch=16), rv(11, batch=64)], before, TH)
    assert cause is not None and cause.text == "batch changed 64 → 16"
    assert setting_changed("batch")([rv(9, batch=64), rv(10, batch=16), rv(11, batch=64)], before, TH) is None
    # Unknown on one side: nothing can be said.
    assert setting_changed("batch")([rv(9, batch=None)], before, TH) is None
    changed = setting_changed("gpu_model")([rv(9, gpu_model="T4")], [rv(1, gpu_model="A100-80GB-SXM")], TH)
    assert changed is not None and changed.text == "gpu_model changed A100-80GB-SXM → T4"


def test_a_finding_that_appeared_counts_only_diagnosed_runs() -> None:
    before = [rv(i) for i in range(9)]
    now = [rv(10 + i, findings=("input_pipeline",)) for i in range(3)] + [rv(20)]
    cause = finding("input_pipeline")(now, before, TH)
    assert cause is not None and cause.text == "input-pipeline bound in 3 of 4 runs (0 of 9 before)"
    # Found as often before: not a change.
    same = [rv(i, findings=("input_pipeline",)) for i in range(9)]
    assert finding("input_pipeline")(now, same, TH) is None
    # Runs the diagnosis did not read are neither evidence for nor against.
    unread = [rv(30 + i, diagnosed=False) for i in range(20)]
    assert finding("input_pipeline")(now + unread, before, TH).text.startswith("input-pipeline bound in 3 of 4 runs")
    # 1 of 5 (20 points more than 0 of 9): below the 25-point threshold.
    assert (
        finding("input_pipeline")([rv(40, findings=("input_pipeline",))] + [rv(41 + i) for i in range(4)], before, TH)
        is None
    )


def test_more_failures_and_worse_results() -> None:
    before = [rv(i) for i in range(12)]
    now = [rv(20, status="failed"), rv(21, status="killed"), rv(22), rv(23), rv(24)]
    assert more_failures(now, before, TH).text == "2 of 5 runs failed, were killed or lost (0 of 12 before)"
    assert more_failures([rv(20, status="failed")] + [rv(21 + i) for i in range(4)], before, TH).text.startswith(
        "1 of 5"
    )
    assert more_failures([rv(20, status="failed")] + [rv(21 + i) for i in range(5)], before, TH) is None  # 17 points
    assert map_fell([rv(30, points="30")], [rv(1, points="40")], TH).text == (
        "mAP gained per run fell from 40.0 to 30.0 points"
    )
    assert map_fell([rv(30, points="37")], [rv(1, points="40")], TH) is None  # 7.5 %


def test_price_per_held_hour_rose() -> None:
    before = [rv(1, cost="10", held_h=4)]  # 2.50 per GPU-hour
    cause = price_rose([rv(2, cost="13.72", held_h=4)], before, TH)  # 3.43 per GPU-hour
    assert cause is not None and cause.text == "cost per GPU-hour held rose from 2.50 to 3.43"
    assert price_rose([rv(2, cost="10.96", held_h=4)], before, TH) is None  # +9.6 %


def anomaly() -> Anomaly:
    return Anomaly(
        "yolov5m",
        "cost_per_map_point",
        W,
        [W - 2 * WEEK_S, W - WEEK_S],
        Decimal("4.10"),
        Decimal("5.535"),
        Decimal("0.35"),
    )


def test_the_message_names_the_setting_behind_the_utilisation_drop() -> None:
    before = [rv(i, busy=0.81, batch=64, workers=8) for i in range(9)]
    now = [rv(10 + i, busy=0.52, batch=16, workers=8, findings=("input_pipeline",)) for i in range(4)]
    a = anomaly()
    explain(a, now, before, currency="USD")
    assert a.message == (
        "cost per mAP point of yolov5m runs rose 35 % last week (2026-W10): 4.10 → 5.54 USD "
        "(median of 2 weeks before); likely cause: utilisation fell from 81 % to 52 % after batch changed 64 → 16; "
        "input-pipeline bound in 4 of 4 runs (0 of 9 before)"
    )
    assert [c.kind for c in a.causes] == ["setting_changed", "utilisation_fell", "finding"]
    assert a.as_dict("model_version")["causes"][0]["figures"] == {"setting": "batch", "before": "64", "now": "16"}


def test_no_cause_is_said_plainly() -> None:
    a = anomaly()
    explain(a, [rv(1)], [rv(2)], currency="")
    assert a.causes == []
    assert a.message.endswith(
        "5.54 (median of 2 weeks before); no likely cause found in the runs' settings, results or diagnosis"
    )


@pytest.mark.parametrize("field", ["busy_drop", "finding_rise", "failed_rise", "price_rise", "map_drop"])
def test_every_threshold_is_used(field: str) -> None:
    """Raising a threshold out of reach silences its cause: each cause reads its own threshold."""
    before = [rv(i, busy=0.9, cost="10", points="40") for i in range(4)]
    now = [rv(10 + i, busy=0.3, cost="20", points="10", status="failed", findings=("underused",)) for i in range(4)]
    loud = {c.kind for c in causes_of(now, before, TH)}
    quiet = {c.kind for c in causes_of(now, before, CauseThresholds(**{field: 2.0}))}
    silenced = {
        "busy_drop": "utilisation_fell",
        "finding_rise": "finding",
        "failed_rise": "more_failures",
        "price_rise": "price_rose",
        "map_drop": "map_fell",
    }[field]
    assert silenced in loud and silenced not in quiet


def test_the_chargeback_doc_states_every_threshold_with_its_default() -> None:
    import dataclasses
    from pathlib import Path

    from gpuledger.core.chargeback.anomaly_rule import AnomalyRule

    doc = (Path(__file__).resolve().parents[1] / "docs" / "CHARGEBACK.md").read_text()
    section = doc[doc.index("## Value for money over weeks") :]
    rows = {line.split("`")[1]: line.split("|")[2].strip() for line in section.splitlines() if line.startswith("| `")}
    for cls in (AnomalyRule, CauseThresholds):
        for f in dataclasses.fields(cls):
            if f.name != "metrics":
                assert float(rows[f.name]) == f.default, (cls.__name__, f.name)
