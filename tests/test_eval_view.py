"""The evaluation block of ``gpuledger show`` and the console fallback's reading of a command line."""

from __future__ import annotations

from pathlib import Path

from gpuledger.cli.eval_view import evaluation_text
from gpuledger.integrations.ultralytics.eval_postrun import _yolo_args, from_console

DATA = Path(__file__).parent / "data" / "yolo"

EVAL = {
    "mode": "val",
    "source": "wrapped",
    "images": 5000,
    "ms_per_image": {"preprocess": 0.21, "inference": 1.234, "postprocess": 0.8},
    "fps_end_to_end": 312.5,
    "fps_inference": 810.37,
    "window": [100.0, 116.0],
    "energy_j": 4800.0,
    "j_per_image": 0.96,
    "power_mean_w": 300.0,
    "power_peak_w": 412.0,
    "busy_share": 0.87,
    "weights": {"path": "/w/best.pt", "sha256": "ab" * 32},
    "split": {
        "name": "val",
        "data": "/d/coco.yaml",
        "path": "/d",
        "fingerprint": "cd" * 32,
        "files": 9952,
        "bytes": 815_000_000,
    },
    "imgsz": 640,
    "batch": 32,
    "precision": "half",
    "device": "cuda:0",
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "versions": {"ultralytics": "8.4.190", "torch": "2.14.1", "cuda": "12.8"},
    "map50": 0.5261,
    "map50_95": 0.3712,
}


def test_block_shows_every_figure() -> None:
    text = evaluation_text({"kind": "evaluation", "evaluation": EVAL})
    assert text.splitlines()[0] == "Evaluation (val, wrapped)"
    for part in (
        "/w/best.pt  sha256 abababababab",
        "val of /d/coco.yaml: 9,952 files, 777 MiB, fingerprint cdcdcdcdcdcd",
        "imgsz 640  batch 32  half  device cuda:0  GPU NVIDIA H100 80GB HBM3",
        "5,000 in 16.0 s",
        "1.23 ms inference",
        "313 end to end   810 inference only",
        "4,800 J   0.960 J/image   power mean 300 W  peak 412 W   GPU busy 87%",
        "mAP50 0.526   mAP50-95 0.371",
        "ultralytics 8.4.190  torch 2.14.1  CUDA 12.8",
    ):
        assert part in text, (part, text)


def test_unmeasured_is_na_never_zero_and_control_characters_are_not_printed() -> None:
    sparse = {"mode": "predict", "source": "python-api", "weights": {"path": "/w/\x1b[2Jevil.pt"}, "split": None}
    text = evaluation_text({"kind": "evaluation", "evaluation": sparse})
    assert "\x1b" not in text
    assert "energy     n/a   n/a   power mean n/a  peak n/a   GPU busy n/a" in text
    assert "images     n/a in n/a" in text
    assert " 0 " not in text
    assert evaluation_text({"framework": "ultralytics", "epochs": 3}) == ""  # a training
    missing = {"name": "val", "data": "/d/x.yaml", "fingerprint": None, "fingerprint_error": "/d/images does not exist"}
    text = evaluation_text({"kind": "evaluation", "evaluation": {**EVAL, "split": missing}})
    assert "split      val of /d/x.yaml: fingerprint n/a (/d/images does not exist)" in text


def test_benchmark_rows() -> None:
    rows = [
        {
            "format": "PyTorch",
            "status": "success",
            "size_mb": 6.2,
            "metric_name": "metrics/mAP50-95(B)",
            "metric": 0.4512,
            "ms_per_image": 12.31,
            "fps": 81.24,
        },
        {
            "format": "TensorFlow SavedModel",
            "status": "export failed",
            "size_mb": 0.0,
            "metric_name": "metrics/mAP50-95(B)",
            "metric": None,
            "ms_per_image": None,
            "fps": None,
        },
    ]
    text = evaluation_text({"kind": "evaluation", "evaluation": {"mode": "benchmark", "benchmark": rows}})
    table = text.split("Benchmark\n", 1)[1].splitlines()
    assert table[0].split() == ["format", "status", "size", "MB", "metrics/mAP50-95(B)", "ms/image", "FPS"]
    assert table[1].split() == ["PyTorch", "success", "6.20", "0.451", "12.3", "81.2"]
    assert table[2].split() == ["TensorFlow", "SavedModel", "export", "failed", "0", "n/a", "n/a", "n/a"]


def test_yolo_command_lines() -> None:
    assert _yolo_args(["/venv/bin/yolo", "detect", "val", "model=a.pt", "data=d.yaml", "split=test"]) == (
        "val",
        {"model": "a.pt", "data": "d.yaml", "split": "test"},
    )
    assert _yolo_args(["bash", "-c", "yolo predict model=a.pt source='my dir'"]) == (
        "predict",
        {"model": "a.pt", "source": "my dir"},
    )
    assert _yolo_args(["yolo", "train", "model=a.yaml"])[0] is None
    assert _yolo_args(["python", "val.py"]) == (None, {})


def test_console_fallback_reads_a_val(tmp_path: Path) -> None:
    log = (DATA / "val_yolov8n_8.4.190.log").read_bytes()
    (tmp_path / "n.pt").write_bytes(b"weights")
    command = ["yolo", "val", "model=n.pt", "data=missing.yaml", "imgsz=64", "batch=2", "quantize=16"]
    record = from_console(log, command, str(tmp_path), 10.0, 20.0)
    assert record is not None
    assert (record["mode"], record["source"], record["images"]) == ("val", "console", 6)
    assert record["ms_per_image"]["inference"] == 48.2
    assert (record["imgsz"], record["batch"], record["precision"]) == (64, 2, "half")
    assert record["weights"]["path"] == str(tmp_path / "n.pt")
    assert record["window"] == [10.0, 20.0] and record["fps_end_to_end"] == 0.6
    assert record["split"] == {"name": "val", "data": "missing.yaml", "path": None}
    assert from_console(log, ["yolo", "train", "model=n.pt"], str(tmp_path), 10.0, 20.0) is None


def test_benchmark_table_fits_the_terminal_and_pipes_unpadded() -> None:
    row = {"format": "TensorRT", "status": "success", "size_mb": 12.5, "metric_name": "metrics/mAP50-95(B)",
           "metric": 0.4512, "ms_per_image": 1.234, "fps": 810.4}  # fmt: skip
    long = {**row, "format": "ONNX", "status": "x" * 10_000}  # a status line as long as a log
    meta = {"kind": "evaluation", "evaluation": {"mode": "benchmark", "benchmark": [row, long]}}
    on_terminal = evaluation_text(meta, 60).split("Benchmark\n", 1)[1].splitlines()
    assert all(len(line) <= 60 for line in on_terminal)
    assert any(line.split()[:1] == ["TensorRT"] and "1.23" in line for line in on_terminal)  # id and numbers whole
    piped = evaluation_text(meta, None).split("Benchmark\n", 1)[1].splitlines()
    assert max(len(line) for line in piped if "ONNX" not in line) < 200  # one long cell pads no other line
    assert any("x" * 10_000 in line for line in piped)  # piped keeps the whole value
