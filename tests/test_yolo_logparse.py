"""The console-output parser on captured YOLO trainings (tests/data/yolo/README.md says how each was made)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from gpuledger.core.training.logparse import ULTRALYTICS, YOLOV5, parse_log, screen_lines

DATA = Path(__file__).parent / "data" / "yolo"
ULTRALYTICS_FIXTURES = [
    "yolov8n_detect",
    "yolov8n_detect_piped",
    "yolo11n_segment",
    "yolo11n_obb",
    "yolo26n_detect",
    "yolo26n_pose",
    "yolov8n_classify",
]


def _results(name: str) -> list[dict[str, float]]:
    with open(DATA / f"{name}.results.csv", newline="") as fh:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def _close(printed: float, exact: float, digits: int) -> bool:
    """``printed`` is ``exact`` shown with ``digits`` significant digits."""
    if exact == 0:
        return printed == 0
    return math.isclose(printed, float(f"{exact:.{digits}g}"), rel_tol=1e-9) or math.isclose(
        printed, exact, rel_tol=10 ** (1 - digits)
    )


@pytest.mark.parametrize("name", ULTRALYTICS_FIXTURES)
def test_ultralytics_output_matches_results_csv(name: str) -> None:
    parsed = parse_log((DATA / f"{name}.log").read_bytes())
    rows = _results(name)
    assert parsed.format == ULTRALYTICS
    assert [e.epoch for e in parsed.epochs] == [int(r["epoch"]) for r in rows]
    assert parsed.total_epochs == len(rows) and parsed.last_epoch == len(rows)
    for epoch, row in zip(parsed.epochs, rows, strict=True):
        train = {k: v for k, v in epoch.metrics.items() if k.startswith("train/")}
        metrics = {k: v for k, v in epoch.metrics.items() if k.startswith("metrics/")}
        # every training loss and validation metric the console shows is a results.csv column
        assert set(train) == {k for k in row if k.startswith("train/")}
        assert set(metrics) == {k for k in row if k.startswith("metrics/")}
        for key, value in train.items():
            assert _close(value, row[key], 4), (key, value, row[key])  # losses print as %11.4g
        for key, value in metrics.items():
            assert _close(value, row[key], 3), (key, value, row[key])  # metrics print as %11.3g
        assert epoch.metrics["gpu_mem_gb"] == 0.0
    assert parsed.final  # the best weights' validation is kept apart, not as an extra epoch


def test_loss_columns_follow_the_model_generation() -> None:
    v8 = parse_log((DATA / "yolov8n_detect.log").read_bytes()).epochs[0].metrics
    v26 = parse_log((DATA / "yolo26n_detect.log").read_bytes()).epochs[0].metrics
    pose = parse_log((DATA / "yolo26n_pose.log").read_bytes()).epochs[0].metrics
    assert "train/dfl_loss" in v8 and "train/l1_loss" not in v8
    assert "train/l1_loss" in v26 and "train/dfl_loss" not in v26
    assert {"train/rle_loss", "metrics/mAP50-95(P)", "metrics/mAP50-95(B)"} <= set(pose)


def test_yolov5_v7_output() -> None:
    parsed = parse_log((DATA / "yolov5_v7.log").read_bytes())
    assert parsed.format == YOLOV5 and parsed.total_epochs == 3
    assert [e.epoch for e in parsed.epochs] == [1, 2, 3]  # printed 0/2 .. 2/2
    last = parsed.epochs[-1].metrics
    assert last == {
        "gpu_mem_gb": 4.05,
        "train/box_loss": 0.08155,
        "train/obj_loss": 0.06512,
        "train/cls_loss": 0.02303,
        "metrics/precision": 0.408,
        "metrics/recall": 0.396,
        "metrics/mAP_0.5": 0.348,
        "metrics/mAP_0.5:0.95": 0.171,
    }
    assert parsed.final["metrics/mAP_0.5"] == 0.9


def test_yolov5_v6_output() -> None:
    parsed = parse_log((DATA / "yolov5_v6.log").read_bytes())
    assert parsed.format == YOLOV5
    assert [e.epoch for e in parsed.epochs] == [1, 2]
    first = parsed.epochs[0].metrics
    assert first["train/box_loss"] == 0.009102 and first["train/obj_loss"] == 0.002411  # the 100% redraw
    assert first["metrics/mAP_0.5:0.95"] == 0.787


def test_an_interrupted_epoch_is_not_reported_as_done() -> None:
    parsed = parse_log((DATA / "fail_sigkill_epoch4.log").read_bytes())
    assert [e.epoch for e in parsed.epochs] == [1, 2, 3]
    assert parsed.last_epoch == 4 and parsed.total_epochs == 30


def test_nan_epochs_redone_by_ultralytics() -> None:
    parsed = parse_log((DATA / "fail_nan_persisted.log").read_bytes())
    assert [e.epoch for e in parsed.epochs] == [1]  # epoch 2 never completed
    assert parsed.nonfinite == {2: ["train/box_loss", "train/cls_loss", "train/dfl_loss"]}


def test_no_training_output() -> None:
    parsed = parse_log((DATA / "fail_dataset_yaml_missing.log").read_bytes())
    assert parsed.format is None and parsed.epochs == [] and parsed.last_epoch is None
    assert parse_log(b"").epochs == []


def test_screen_lines_keep_the_last_redraw_without_colours() -> None:
    raw = b"\x1b[34m\x1b[1mtrain: \x1b[0mok\r\n\r\x1b[K  1/2  a: 0%\r\x1b[K  1/2  b: 100%\r\nnext"
    assert screen_lines(raw) == ["train: ok", "  1/2  b: 100%", "next"]


def test_two_trainings_in_one_output_report_the_last() -> None:
    text = (DATA / "yolov8n_detect.log").read_bytes()
    parsed = parse_log(text + text.replace(b"6.843", b"1.234"))
    assert [e.epoch for e in parsed.epochs] == [1, 2]
    assert parsed.epochs[0].metrics["train/box_loss"] == 1.234
