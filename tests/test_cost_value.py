"""Value for money of YOLO runs: cost per epoch, per 1,000 training images, per mAP50-95 point."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from cost_support import H, card, ts
from gpuledger.core.chargeback.value import value_for_money, yolo_inputs
from gpuledger.core.model import GpuIdentity, GpuInterval, Metric, RunRecord
from gpuledger.reports.cost.costing import run_value
from gpuledger.reports.cost.run_money import run_cost, run_cost_and_value
from gpuledger.reports.cost.run_money import value_for_money as value_of_run
from gpuledger.store import Ledger


def test_hand_computed_value_for_money() -> None:
    v = value_for_money(Decimal("41.20"), epochs=10, train_images=5000, map50_95=0.412, currency="USD")
    assert v.cost_per_epoch == Decimal("4.12")
    assert v.images_seen == 50_000
    assert v.cost_per_1k_images == Decimal("0.824")  # 41.20 / 50
    assert v.cost_per_map_point == Decimal("1.00")  # 41.20 / 41.2 points
    assert v.as_dict()["cost_per_map_point"] == "1.000000"
    empty = value_for_money(Decimal("5"), epochs=None, train_images=None, map50_95=float("nan"))
    assert (empty.cost_per_epoch, empty.cost_per_1k_images, empty.cost_per_map_point) == (None, None, None)


def test_yolo_inputs_from_meta_and_epoch_metrics() -> None:
    metrics = [
        Metric(1.0, "metrics/mAP50-95(B)", 0.20, epoch=1),
        Metric(2.0, "metrics/mAP50-95(B)", 0.31, epoch=2),
        Metric(2.0, "train/box_loss", 1.2, epoch=2),
        Metric(3.0, "metrics/mAP50-95(B)", 0.29, epoch=3),
    ]
    meta = {"dataset": {"images": {"train": 128, "val": 32}}}
    assert yolo_inputs(meta, metrics) == {"epochs": 3, "train_images": 128, "map50_95": 0.31}
    meta["result"] = {"best_map50_95": 0.305}  # the integration's own figure wins
    assert yolo_inputs(meta, metrics)["map50_95"] == 0.305
    assert yolo_inputs({}, []) == {"epochs": None, "train_images": None, "map50_95": None}


def test_a_resumed_yolo_run_is_valued_over_all_its_attempts(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rates = tmp_path / "rates.toml"
    rates.write_text('[card]\ncurrency = "USD"\nbasis = "allocated"\n[[gpu]]\nmodel = "T4"\nprice_per_hour = "1.00"\n')
    monkeypatch.setenv("GPULEDGER_RATES", str(rates))
    meta = {"dataset": {"images": {"train": 1000}}}
    with Ledger(tmp_path / "l.db") as led:
        for rid, start, epochs, parent in (
            ("a1", "2026-03-01T00:00", (1, 2), None),
            ("a2", "2026-03-01T03:00", (3, 4), "a1"),
        ):
            t0 = ts(start)
            led.create_run(
                RunRecord(
                    rid,
                    ["yolo"],
                    "u",
                    "h",
                    "/",
                    t0,
                    status="succeeded" if parent else "failed",
                    ended_at=t0 + 2 * H,
                    meta=meta,
                    attempt_of=parent,
                )
            )
            led.add_devices(rid, [GpuIdentity(0, f"GPU-{rid}", "Tesla T4")])
            led.append(rid, gpu=[GpuInterval(f"GPU-{rid}", 0, t0, t0 + 2 * H, busy_s=H, energy_j=1.0)])
            led.append(rid, metrics=[Metric(t0 + e, "metrics/mAP50-95(B)", 0.1 * e, epoch=e) for e in epochs])
        v = run_value(led, "a2", scope=None, card=card('[[gpu]]\nmodel = "T4"\nprice_per_hour = "1.00"\n', "allocated"))
        assert (v.cost, v.epochs, v.images_seen, v.map50_95) == (Decimal("4.00"), 4, 4000, 0.4)
        assert v.cost_per_epoch == Decimal("1.00") and v.cost_per_map_point == Decimal("0.1")
        seam = value_of_run(led, "a2")  # what gpuledger compare and the run reports call
        assert seam["cost"] == "4.00" and seam["cost_per_1k_images"] == "1.000000"
        priced = run_cost(led, "a2")
        assert priced["total"] == "2.00" and priced["currency"] == "USD" and priced["logical_run"]["cost"] == "4.00"
        # The run report prices once for both (reports/run/cost_hook.run_cost_and_value).
        assert run_cost_and_value(led, "a2") == {"cost": priced, "value": seam}
