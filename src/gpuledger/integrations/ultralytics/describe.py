"""What ran: the metadata of an Ultralytics training, as plain JSON-able dicts.

Shared by the live callbacks (from the trainer object) and the importer (from a run directory), so
both put the same keys in ``run.meta``:

``framework``, ``task``, ``save_dir``, ``imgsz``, ``batch``, ``epochs``, ``device``,
``hyperparameters`` (resolved values), ``args_yaml`` (save_dir/args.yaml as written),
``model`` {source, kind: yaml|weights, name, parameters, size_b, sha256},
``dataset`` {name, yaml, sha256, classes, nc, path, splits, images {train, val, test}},
``versions`` {ultralytics, torch}; at the end ``result`` {best_epoch, best_fitness, best_map50_95,
speed_ms_per_image, final_validation} and ``weights`` [{name, path, size_b, sha256}].
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

MAX_CLASS_NAMES = 2000  # keeps a metadata message under the control socket's datagram size
MAX_COUNTED_FILES = 200_000  # counting a huge test split is not worth a slow start
GENERIC_YAML_NAMES = {"data", "dataset", "config"}
IMAGE_SUFFIXES = {".bmp", ".dng", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp", ".pfm", ".heic"}


def jsonable(value: Any) -> Any:
    """Paths, tuples, numpy scalars ... as JSON values; anything else as its str()."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item"):  # numpy / torch scalar
        try:
            return jsonable(value.item())
        except Exception:
            pass
    return str(value)


def sha256_file(path: str | os.PathLike[str]) -> str | None:
    try:
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()
    except OSError:
        return None


def file_info(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError:
        return None
    return {"name": p.name, "path": str(p.resolve()), "size_b": size, "sha256": sha256_file(p)}


def weights_info(save_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    folder = Path(save_dir) / "weights"
    files = sorted(folder.glob("*.pt")) if folder.is_dir() else []
    return [info for info in (file_info(f) for f in files) if info is not None]


def class_names(names: Any) -> list[str]:
    if isinstance(names, Mapping):
        return [str(names[k]) for k in sorted(names)][:MAX_CLASS_NAMES]
    if isinstance(names, (list, tuple)):
        return [str(n) for n in names][:MAX_CLASS_NAMES]
    return []


def count_images(split: Any, root: Any = None) -> int | None:
    """Images in a split given as a folder, a .txt list or a list of those; None if unknown/too many."""
    if not split:
        return None
    if isinstance(split, (list, tuple)):
        counts = [count_images(s, root) for s in split]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)
    path = Path(str(split))
    if not path.is_absolute() and root:
        path = Path(str(root)) / path
    try:
        if path.is_file() and path.suffix == ".txt":
            with open(path, encoding="utf-8", errors="replace") as fh:
                return sum(1 for line in fh if line.strip())
        if not path.is_dir():
            return None
        seen = 0
        count = 0
        for _dirpath, _dirs, files in os.walk(path):
            for name in files:
                seen += 1
                if seen > MAX_COUNTED_FILES:
                    return None
                if os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES:
                    count += 1
        return count
    except OSError:
        return None


def dataset_info(data: Mapping[str, Any], data_arg: Any, images: Mapping[str, int | None]) -> dict[str, Any]:
    """The dataset: where its data.yaml is (and its sha256), classes, splits, image counts."""
    yaml_file = data.get("yaml_file")
    if not yaml_file and isinstance(data_arg, (str, os.PathLike)) and str(data_arg).endswith((".yaml", ".yml")):
        yaml_file = data_arg
    source = Path(str(yaml_file or data_arg or ""))
    name = source.stem if yaml_file else source.name
    if name in GENERIC_YAML_NAMES:  # Roboflow-style "data.yaml": the folder says which dataset
        name = source.resolve().parent.name or name
    info: dict[str, Any] = {
        "name": name or None,
        "yaml": str(Path(str(yaml_file)).resolve()) if yaml_file else None,
        "sha256": sha256_file(yaml_file) if yaml_file else None,
        "classes": class_names(data.get("names")),
        "nc": data.get("nc") or (len(data["names"]) if data.get("names") else None),
        "path": jsonable(data.get("path")),
        "splits": {k: jsonable(data.get(k)) for k in ("train", "val", "test") if data.get(k)},
        "images": dict(images),
    }
    return info


def args_fields(args: Mapping[str, Any], save_dir: str) -> dict[str, Any]:
    """The run metadata a training's args.yaml gives (the layout ``trainer_meta`` writes live):
    for a run read back from its folder (importers/ultralytics.py) or through a container's mounts
    (node/yolo_rundir.py). The caller adds ``model``: only it knows whether the path may be opened."""
    return {
        "framework": "ultralytics",
        "task": args.get("task"),
        "save_dir": save_dir,
        "imgsz": jsonable(args.get("imgsz")),
        "batch": args.get("batch"),
        "epochs": args.get("epochs"),
        "device": None if args.get("device") is None else str(args.get("device")),
        "hyperparameters": jsonable(args),
        "args_yaml": jsonable(args),
    }


def model_info(source: Any, parameters: int | None) -> dict[str, Any]:
    text = str(source) if source is not None else ""
    kind = "yaml" if text.endswith((".yaml", ".yml")) else "weights"
    info: dict[str, Any] = {
        "source": text or None,
        "kind": kind,
        "name": Path(text).stem or None,
        "parameters": parameters,
    }
    if kind == "weights" and text and Path(text).is_file():
        file = file_info(text)
        if file:
            info.update(path=file["path"], size_b=file["size_b"], sha256=file["sha256"])
    return info


def labels_for(meta: Mapping[str, Any]) -> dict[str, str]:
    """The ``model`` and ``dataset`` labels filled automatically (command-line labels win)."""
    labels = {}
    model = (meta.get("model") or {}).get("name")
    dataset = (meta.get("dataset") or {}).get("name")
    if model:
        labels["model"] = str(model)
    if dataset:
        labels["dataset"] = str(dataset)
    return labels


# -- results.csv ------------------------------------------------------------------------------


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


RESULTS_MAX_B = 32 * 1024 * 1024  # the most of a results.csv read: ~150,000 epochs of a detection training


def complete_epoch_rows(data: bytes) -> list[dict[str, float]]:
    """The epochs of results.csv's bytes ``data``: its complete lines only (a row being written is
    left for a later look), rows with a whole epoch number from 1."""
    end = data.rfind(b"\n")
    rows = parse_results_csv(data[: end + 1].decode("utf-8", "replace")) if end >= 0 else []
    return [r for r in rows if "epoch" in r and float(r["epoch"]).is_integer() and r["epoch"] >= 1]


def parse_results_csv(text: str) -> list[dict[str, float]]:
    """Rows of an Ultralytics results.csv as {column: value} (column names stripped, as YOLOv5 pads them)."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if not header:
        return []
    keys = [h.strip() for h in header]
    rows = []
    for record in reader:
        if len(record) != len(keys):
            continue  # a row being written, or a corrupt one
        values = [_float(v.strip()) for v in record]
        rows.append({k: v for k, v in zip(keys, values, strict=True) if v is not None})
    return rows


def read_results_csv(path: str | os.PathLike[str]) -> list[dict[str, float]]:
    try:
        return parse_results_csv(Path(path).read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return []


def last_results_row(path: str | os.PathLike[str], tail_b: int = 65536) -> dict[str, float] | None:
    """The last row of results.csv without reading a long file whole."""
    try:
        with open(path, "rb") as fh:
            header = fh.readline().decode("utf-8", "replace")
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(len(header), size - tail_b))
            lines = [ln for ln in fh.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return None
    if not lines:
        return None
    rows = parse_results_csv(header + lines[-1] + "\n")
    return rows[-1] if rows else None


def epoch_metrics(row: Mapping[str, float]) -> dict[str, float]:
    """A results.csv row as the epoch's metrics: every column but ``epoch`` (which is Metric.epoch)."""
    return {k: v for k, v in row.items() if k != "epoch"}


def map50_95(row: Mapping[str, float]) -> float | None:
    for key in ("metrics/mAP50-95(B)", "metrics/mAP50-95(M)", "metrics/mAP_0.5:0.95"):
        if key in row:
            return row[key]
    return next((v for k, v in row.items() if k.startswith("metrics/mAP50-95")), None)


def fitness(row: Mapping[str, float]) -> float | None:
    """Ultralytics' fitness from a results row: the sum of the mAP50-95 columns (detect, segment,
    pose, obb), or the mean of top-1 and top-5 accuracy (classify)."""
    maps = [v for k, v in row.items() if k.startswith("metrics/mAP50-95") and math.isfinite(v)]
    if maps:
        return sum(maps)
    if "metrics/accuracy_top1" in row and "metrics/accuracy_top5" in row:
        return (row["metrics/accuracy_top1"] + row["metrics/accuracy_top5"]) / 2
    if "metrics/mAP_0.5:0.95" in row:  # YOLOv5: 0.1 mAP@.5 + 0.9 mAP@.5:.95
        return 0.1 * row.get("metrics/mAP_0.5", 0.0) + 0.9 * row["metrics/mAP_0.5:0.95"]
    return None


def best_row(rows: Iterable[Mapping[str, float]]) -> Mapping[str, float] | None:
    """The row Ultralytics would keep as best.pt: the highest fitness, the later one on ties."""
    best, best_fit = None, None
    for row in rows:
        fit = fitness(row)
        if fit is not None and (best_fit is None or fit >= best_fit):
            best, best_fit = row, fit
    return best
