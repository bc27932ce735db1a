"""Reading ``yolo benchmark | val | predict`` output back (core/evaluation/console.py), from real
output of the installed Ultralytics and the pandas layout of earlier versions (tests/data/yolo)."""

from __future__ import annotations

from pathlib import Path

from gpuledger.core.evaluation.console import parse_benchmark, parse_predict, parse_val

DATA = Path(__file__).parent / "data" / "yolo"


def _read(name: str) -> bytes:
    return (DATA / name).read_bytes()


def test_benchmark_table_of_ultralytics_8_4_polars() -> None:
    table = parse_benchmark(_read("benchmark_8.4.190_cpu.log"))
    assert table is not None
    assert (table["model"], table["data"], table["imgsz"], table["seconds"]) == (
        "/tmp/m1/n.pt",
        "/tmp/m1/ds/data.yaml",
        64,
        5.8,
    )
    rows = table["rows"]
    assert len(rows) == 23  # every format Ultralytics 8.4.190 lists
    assert rows[0] == {
        "format": "PyTorch",
        "status": "success",
        "size_mb": 6.2,
        "metric_name": "metrics/mAP50-95(B)",
        "metric": 0.0,
        "ms_per_image": 5.35,
        "fps": 186.76,
    }
    assert rows[1]["format"] == "TorchScript" and rows[1]["fps"] == 157.35
    by_name = {r["format"]: r for r in rows}
    assert by_name["TensorFlow SavedModel"]["status"] == "export failed"  # a name with a space
    assert by_name["ONNX"] == {**by_name["ONNX"], "metric": None, "ms_per_image": None, "fps": None}  # "-"
    assert rows[-1]["format"] == "AMD Xilinx"


def test_benchmark_table_of_ultralytics_8_2_pandas() -> None:
    table = parse_benchmark(_read("benchmark_pandas_8.2.log"))
    assert table is not None
    assert (table["model"], table["data"], table["imgsz"]) == ("yolov8n.pt", "coco8.yaml", 160)
    rows = {r["format"]: r for r in table["rows"]}
    assert len(rows) == 13
    assert rows["ONNX"]["ms_per_image"] == 7.45 and rows["ONNX"]["fps"] == 134.23  # one space apart
    assert rows["OpenVINO"]["status"] == "validation failed" and rows["OpenVINO"]["metric"] is None  # NaN
    assert rows["TensorFlow Edge TPU"]["status"] == "export failed"
    assert rows["TensorFlow.js"]["size_mb"] == 12.3
    assert rows["NCNN"]["metric"] == 0.447


def test_benchmark_table_without_fps_column_and_no_table() -> None:
    text = (
        "Benchmarks complete for yolov8n.pt on coco128.yaml at imgsz=640 (12.00s)\n"
        "                   Format Status❔  Size (MB)  metrics/mAP50-95(B)  Inference time (ms/im)\n"
        "0                 PyTorch       ✅        6.2               0.4456                  105.96\n"
    )
    table = parse_benchmark(text)
    assert table is not None
    assert table["rows"][0]["ms_per_image"] == 105.96 and table["rows"][0]["fps"] is None
    assert parse_benchmark(_read("val_yolov8n_8.4.190.log")) is None


def test_val_output() -> None:
    val = parse_val(_read("val_yolov8n_8.4.190.log"))
    assert val == {
        "images": 6,
        "ms_per_image": {"preprocess": 0.0, "inference": 48.2, "postprocess": 0.1},
        "map50": 0.0,
        "map50_95": 0.0,
    }
    text = (
        "                 Class     Images  Instances      Box(P          R      mAP50  mAP50-95)     Mask(P  ...\n"
        "                   all        128        929      0.712      0.601      0.675      0.504      0.70  0.59"
        "  0.64  0.41\n"
        "Speed: 0.3ms preprocess, 4.1ms inference, 0.0ms loss, 1.2ms postprocess per image\n"
    )
    seg = parse_val(text)
    assert seg is not None and (seg["images"], seg["map50"], seg["map50_95"]) == (128, 0.675, 0.504)  # boxes
    assert parse_val(_read("predict_yolov8n_8.4.190.log")) is None


def test_predict_output() -> None:
    pred = parse_predict(_read("predict_yolov8n_8.4.190.log"))
    assert pred == {
        "images": 6,
        "ms_per_image": {"preprocess": 0.2, "inference": 9.1, "postprocess": 0.3},
        "batch": 1,
        "imgsz": 64,
    }
    assert parse_predict(_read("val_yolov8n_8.4.190.log")) is None
