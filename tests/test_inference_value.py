"""Value trends by model_version gain the evaluation runs' cost per 1,000 images and energy per image
(reports/cost/inference_value.py, issue 37). Expected figures come from the rate card's price and
the evaluations' own numbers, worked out here."""

from __future__ import annotations

from decimal import Decimal

import pytest

from cost_support import ts
from gpuledger.core.model import GpuIdentity, GpuInterval, RunRecord
from gpuledger.reports.cost.value_trends import value_trends
from gpuledger.store import Ledger
from value_sim import CARD, RATE

W1 = "1" * 64
WEEK = ts("2026-03-23")  # Monday of 2026-W13
END = ts("2026-03-30")
STEP = 60.0
V1 = {"model_version": "v1"}


def _run(ledger: Ledger, rid: str, start: float, minutes: int, meta: dict, labels: dict | None = None) -> None:
    ledger.create_run(
        RunRecord(
            id=rid, command=["yolo"], user="ana", host="box", cwd="/w", started_at=start, status="succeeded",
            ended_at=start + minutes * STEP, meta=meta, labels={"project": "p", **(labels or {})},
        )
    )  # fmt: skip
    uuid = f"GPU-{rid[-4:]}"
    ledger.add_devices(rid, [GpuIdentity(0, uuid, "NVIDIA A100-SXM4-80GB", memory_total_b=80 * 2**30)])
    ledger.append(
        rid,
        gpu=[
            GpuInterval(uuid, k, start + k * STEP, start + (k + 1) * STEP, samples=60, busy_s=30.0, energy_j=300 * STEP)
            for k in range(minutes)
        ],
    )


def _evaluation(images: int, energy_j: float | None) -> dict:
    ev = {"mode": "val", "images": images, "energy_j": energy_j, "weights": {"path": "/w/best.pt", "sha256": W1}}
    return {"kind": "evaluation", "evaluation": ev}


def test_evaluations_count_for_their_model_version_with_cost_per_1k_images_and_j_per_image(tmp_path) -> None:  # type: ignore[no-untyped-def]
    db = f"sqlite:///{tmp_path}/ledger.db"
    training = {"framework": "ultralytics", "lineage": {"model_version": "v1", "weights_sha256": W1}}
    with Ledger(db) as ledger:
        _run(ledger, "0190c0c0-0000-7000-8000-0000000003a1", WEEK, 60, training, {"model_version": "v1"})
        # Two evaluations of v1's weights (no label: found through the lineage), 30 and 15 minutes.
        _run(ledger, "0190c0c0-0000-7000-8000-0000000003e1", WEEK + 7200, 30, _evaluation(5000, 1500.0))
        _run(ledger, "0190c0c0-0000-7000-8000-0000000003e2", WEEK + 14400, 15, _evaluation(1000, 500.0))
        # An evaluation labelled v2 whose energy was not measured.
        v2 = {"model_version": "v2"}
        _run(ledger, "0190c0c0-0000-7000-8000-0000000003e3", WEEK + 20000, 6, _evaluation(200, None), v2)
        trends = value_trends(ledger, scope=None, card=CARD, end=END, weeks=2)
    cells = {c["model_version"]: c for c in trends.as_dict()["inference"]}
    v1 = cells["v1"]
    assert v1["week"] == "2026-W13" and v1["evaluations"] == 2 and v1["images"] == 6000
    cost = Decimal(str(RATE)) * Decimal(45) / Decimal(60)  # 45 allocated minutes at the card's hourly price
    assert Decimal(v1["cost"]) == cost
    assert Decimal(v1["cost_per_1k_images"]) == (cost / 6).quantize(Decimal("0.000001"))
    assert v1["j_per_image"] == pytest.approx((1500.0 + 500.0) / 6000, abs=1e-6)
    v2 = cells["v2"]
    assert v2["images"] == 200 and v2["j_per_image"] is None and v2["energy_j"] is None  # never a partial figure
    assert Decimal(v2["cost_per_1k_images"]) == (Decimal(str(RATE)) / 10 / Decimal("0.2")).quantize(Decimal("0.000001"))


def test_only_by_model_version(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with Ledger(f"sqlite:///{tmp_path}/l.db") as ledger:
        assert value_trends(ledger, scope=None, card=CARD, end=END, weeks=2, by="model").inference == []


def test_lineage_prices_each_version_with_the_rate_card(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import json

    from click.testing import CliRunner

    from gpuledger.cli.main import cli
    from value_sim import CARD_TEXT

    rates = tmp_path / "rates.toml"
    rates.write_text('[card]\ncurrency = "USD"\nbasis = "allocated"\n' + CARD_TEXT)
    monkeypatch.setenv("GPULEDGER_RATES", str(rates))
    db = f"sqlite:///{tmp_path}/ledger.db"
    lineage = {"model_version": "v1", "weights_sha256": W1, "model_line": "yolov8n"}
    with Ledger(db) as ledger:
        _run(ledger, "0190c0c0-0000-7000-8000-0000000003a1", WEEK, 60, {"lineage": lineage})
    out = CliRunner().invoke(cli, ["lineage", "v1", "--json", "--db", db])
    assert out.exit_code == 0, out.output
    (version,) = json.loads(out.stdout)["versions"]
    assert version["cost"] == f"{RATE} USD" and version["gpu_hours"] == 1.0  # one allocated hour
    table = CliRunner().invoke(cli, ["lineage", "v1", "--db", db]).stdout
    assert "3.43 USD" in table


def test_rolled_up_evaluations_cost_the_same_per_1k_images(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Priced from their rollups once `report rollup` ran, as the chargeback prices them: same cells.
    from gpuledger.reports.cost.rollups import materialise_rollups

    db = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger(db) as ledger:
        _run(ledger, "0190c0c0-0000-7000-8000-0000000003e1", WEEK + 7200, 30, _evaluation(5000, 1500.0), V1)
        _run(ledger, "0190c0c0-0000-7000-8000-0000000003e2", WEEK + 14400, 15, _evaluation(1000, 500.0), V1)
        before = value_trends(ledger, scope=None, card=CARD, end=END, weeks=2).as_dict()["inference"]
        assert materialise_rollups(ledger)["runs"] == 2
        after = value_trends(ledger, scope=None, card=CARD, end=END, weeks=2).as_dict()["inference"]
    assert after == before and Decimal(after[0]["cost"]) == Decimal(str(RATE)) * Decimal(45) / Decimal(60)
