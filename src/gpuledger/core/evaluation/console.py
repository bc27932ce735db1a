"""What ``yolo val``, ``yolo predict`` and ``yolo benchmark`` print, read back from the console.

The fallback when the callbacks did not report (a Python the hook cannot load into, output
imported from elsewhere). Formats, from Ultralytics' sources:

- val (engine/validator.py): the metrics row ``all <images> <instances> P R mAP50 mAP50-95 ...``
  and ``Speed: %.1fms preprocess, %.1fms inference, %.1fms loss, %.1fms postprocess per image``;
- predict (engine/predictor.py): one ``image i/N path: ...`` line per image and ``Speed: %.1fms
  preprocess, %.1fms inference, %.1fms postprocess per image at shape (b, c, h, w)``;
- benchmark (utils/benchmarks.py): ``Benchmarks complete for <model> on <data> at imgsz=<n>
  (<s>s)``, then a table whose columns are Format, Status, Size (MB), the task's metric (e.g.
  ``metrics/mAP50-95(B)``), Inference time (ms/im) and FPS: bordered (polars, Ultralytics >= 8.3)
  or plain with a row index (pandas, earlier), a missing value printed ``-``, ``NaN`` or ``None``.
"""

from __future__ import annotations

import re
from typing import Any

from gpuledger.core.training.logparse import screen_lines

_SPEED = re.compile(r"^Speed: (.*?) per image(?: at shape \(([\d, ]+)\))?")
_SPEED_PART = re.compile(r"([\d.]+)ms (\w+)")
_IMAGE_LINE = re.compile(r"^(?:image|video) \d+/(\d+)\b")
_COMPLETE = re.compile(r"Benchmarks complete for (.+?) on (.+?) at imgsz=(\S+?) \(([\d.]+)s\)")
_MISSING = {"-", "nan", "none", "null", ""}
STATUS_WORDS = {"✅": "success", "❎": "validation failed", "❌": "export failed"}


def _float(token: str) -> float | None:
    if token.lower() in _MISSING:
        return None
    try:
        return float(token)
    except ValueError:
        return None


def _status(token: str) -> str | None:
    for mark, word in STATUS_WORDS.items():
        if mark in token:
            return word
    return None


def parse_benchmark(data: bytes | str) -> dict[str, Any] | None:
    """``{model, data, imgsz, seconds, metric_name, rows}`` of the last benchmark table, or None.

    ``rows``: ``{format, status, size_mb, metric_name, metric, ms_per_image, fps}`` (the shape of
    ``meta.evaluation.benchmark``)."""
    lines = screen_lines(data)
    starts = [i for i, line in enumerate(lines) if "Benchmarks complete for" in line]
    header_at = [i for i, line in enumerate(lines) if "Format" in line and "Status" in line]
    if not header_at:
        return None
    first = header_at[-1]
    info: dict[str, Any] = {"model": None, "data": None, "imgsz": None, "seconds": None}
    before = [i for i in starts if i < first]
    if before:
        found = _COMPLETE.search(lines[before[-1]])
        if found:
            imgsz = found.group(3)
            info = {
                "model": found.group(1),
                "data": found.group(2),
                "imgsz": int(imgsz) if imgsz.isdigit() else imgsz,
                "seconds": float(found.group(4)),
            }
    metric_name = next((t for t in lines[first].replace("|", " ").split() if t.startswith("metrics/")), "metric")
    rows = []
    for line in lines[first + 1 :]:
        tokens = line.replace("|", " ").split()
        if not tokens or set(line.strip()) <= set("+-=| "):
            if rows and not tokens:
                break  # the blank line after the table
            continue
        at = next((i for i, t in enumerate(tokens) if _status(t)), None)
        if at is None:
            break
        name = tokens[1:at] if tokens[0].isdigit() and at > 1 else tokens[:at]
        values = [_float(t) for t in tokens[at + 1 :]] + [None] * 4
        rows.append(
            {
                "format": " ".join(name),
                "status": _status(tokens[at]),
                "size_mb": values[0],
                "metric_name": metric_name,
                "metric": values[1],
                "ms_per_image": values[2],
                "fps": values[3],
            }
        )
    return {**info, "metric_name": metric_name, "rows": rows} if rows else None


def _speed(line: str) -> tuple[dict[str, float], str | None] | None:
    found = _SPEED.match(line.strip())
    if not found:
        return None
    parts = {name: float(value) for value, name in _SPEED_PART.findall(found.group(1))}
    return parts, found.group(2)


def parse_val(data: bytes | str) -> dict[str, Any] | None:
    """``{images, ms_per_image, map50, map50_95}`` of the last validation printed, or None.

    mAP50 and mAP50-95 are the first pair of the ``all`` row (the boxes, for segment and pose)."""
    lines = screen_lines(data)
    speed_at = [i for i, line in enumerate(lines) if _speed(line) and "loss" in line]
    if not speed_at:
        return None
    last = speed_at[-1]
    parsed = _speed(lines[last])
    assert parsed is not None
    speed = {k: v for k, v in parsed[0].items() if k != "loss"}
    out: dict[str, Any] = {"images": None, "ms_per_image": speed, "map50": None, "map50_95": None}
    for line in reversed(lines[:last]):
        tokens = line.split()
        if len(tokens) >= 7 and tokens[0] == "all":
            numbers = [_float(t) for t in tokens[1:7]]
            if all(n is not None for n in numbers):
                out["images"] = int(numbers[0] or 0)
                out["map50"], out["map50_95"] = numbers[4], numbers[5]
            break
    return out


def parse_predict(data: bytes | str) -> dict[str, Any] | None:
    """``{images, ms_per_image, batch, imgsz}`` of the predictions printed, or None.

    ``images`` counts the ``image i/N`` lines (a video's frames too); without them (verbose=False)
    it is unknown."""
    lines = screen_lines(data)
    speeds = [(i, s) for i, line in enumerate(lines) if (s := _speed(line)) and "loss" not in line]
    if not speeds:
        return None
    _, (speed, shape) = speeds[-1]
    images = sum(1 for line in lines if _IMAGE_LINE.match(line.strip())) or None
    out: dict[str, Any] = {"images": images, "ms_per_image": speed, "batch": None, "imgsz": None}
    if shape:
        dims = [int(x) for x in shape.replace(" ", "").split(",") if x]
        if len(dims) == 4:
            out["batch"] = dims[0]
            out["imgsz"] = dims[2] if dims[2] == dims[3] else [dims[2], dims[3]]
    return out
