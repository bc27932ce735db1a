"""Past Ultralytics (and YOLOv5) run directories as runs of status ``imported``.

A run directory is what ``yolo train`` leaves in ``project/name``: results.csv (one row per epoch),
args.yaml (YOLOv5: opt.yaml) and weights/. The import stores the epochs as metrics (the same keys
and values as a live-recorded run), the configuration as ``run.meta`` (describe.py's layout) and no
resource data, since nobody metered it.

Idempotent: the run id is derived from the content of results.csv and args.yaml (a UUIDv8), so
importing the same directory again finds the run and changes nothing; a directory that trained
further since is a new run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuledger.core.model import Metric, RunRecord
from gpuledger.core.redaction.records import TextCache, redact_run_fields
from gpuledger.core.redaction.redact import Redactor
from gpuledger.integrations.ultralytics import describe

if TYPE_CHECKING:
    from gpuledger.store import Ledger

ARGS_FILES = ("args.yaml", "opt.yaml")  # Ultralytics, YOLOv5
MAX_RUN_DIRS_LISTED = 3


class NotARunDirectory(ValueError):
    """PATH is not a training output directory; the message says what it is and what to do."""


@dataclass
class ImportResult:
    path: str
    run_id: str
    created: bool  # False: imported before, nothing changed
    epochs: int
    also_recorded_as: str | None = None  # a run recorded live by gpuledger for the same directory


def import_id(results_csv: bytes, args_yaml: bytes) -> str:
    """A UUIDv8 from the content that defines the run: same files, same id."""
    content = b"gpuledger/import/ultralytics\0" + results_csv + b"\0" + args_yaml
    digest = bytearray(hashlib.sha256(content).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x80  # version 8
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 9562 variant
    return str(uuid.UUID(bytes=bytes(digest)))


def find_run_dirs(root: str | os.PathLike[str], limit: int = 10_000) -> list[Path]:
    """Folders under ``root`` (itself included) that hold a results.csv, sorted."""
    found = []
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("weights", ".git", "__pycache__"))
        if "results.csv" in files:
            found.append(Path(dirpath))
            if len(found) >= limit:
                break
    return sorted(found)


def _check_run_dir(path: Path) -> None:
    if not path.exists():
        raise NotARunDirectory(f"{path}: no such directory")
    if not path.is_dir():
        raise NotARunDirectory(f"{path} is a file; give the run directory that holds results.csv and args.yaml")
    if (path / "results.csv").is_file():
        return
    below = find_run_dirs(path, limit=MAX_RUN_DIRS_LISTED + 1)
    if below:
        examples = ", ".join(str(p) for p in below[:MAX_RUN_DIRS_LISTED])
        more = " ..." if len(below) > MAX_RUN_DIRS_LISTED else ""
        raise NotARunDirectory(
            f"{path} is not an Ultralytics run directory (no results.csv) but contains run directories "
            f"({examples}{more}): give those, or add --recursive"
        )
    raise NotARunDirectory(
        f"{path} is not an Ultralytics run directory: no results.csv (expected the folder a training wrote, "
        "e.g. runs/detect/train, with results.csv, args.yaml and weights/)"
    )


def _load_yaml(data: bytes) -> dict[str, Any]:
    try:
        import yaml
    except ImportError as exc:  # PyYAML comes with Ultralytics
        raise RuntimeError("reading args.yaml needs PyYAML: pip install pyyaml") from exc
    loaded = yaml.safe_load(data.decode("utf-8", "replace")) if data else None
    return loaded if isinstance(loaded, dict) else {}


def _owner(path: Path) -> str:
    try:
        import pwd

        return pwd.getpwuid(path.stat().st_uid).pw_name
    except (ImportError, KeyError, OSError):
        return os.environ.get("USER", "unknown")


def _dataset(args: dict[str, Any], rows_dir: Path) -> dict[str, Any]:
    data_arg = args.get("data")
    data: dict[str, Any] = {}
    data_path = Path(str(data_arg)) if data_arg else None
    if data_path and data_path.suffix in (".yaml", ".yml") and data_path.is_file():
        data = _load_yaml(data_path.read_bytes())
        data["yaml_file"] = str(data_path)
    root = data.get("path")
    if root and not Path(str(root)).is_absolute() and data_path:
        root = str((data_path.parent / str(root)).resolve())
    images = {split: describe.count_images(data.get(split), root) for split in ("train", "val", "test")}
    if not data and data_path and data_path.is_dir():  # classification: a folder per split
        images = {split: describe.count_images(data_path / split) for split in ("train", "val", "test")}
    return describe.dataset_info(data, data_arg, images)


def _command(args: dict[str, Any]) -> list[str]:
    """A ``yolo`` command line with the main arguments (the original command is not on disk)."""
    keys = ("model", "data", "epochs", "imgsz", "batch", "device")
    return ["yolo", str(args.get("task") or "detect"), "train", *[f"{k}={args[k]}" for k in keys if k in args]]


def read_run_dir(path: str | os.PathLike[str]) -> tuple[RunRecord, list[Metric]]:
    """The run and its epoch metrics as stored by ``import_run_dir`` (nothing is written)."""
    folder = Path(path).expanduser().resolve()
    _check_run_dir(folder)
    results = (folder / "results.csv").read_bytes()
    rows = describe.parse_results_csv(results.decode("utf-8", "replace"))
    if not rows or not all("epoch" in r for r in rows):
        raise NotARunDirectory(f"{folder}/results.csv has no epoch rows: the training wrote no epoch yet")
    args_file = next((folder / name for name in ARGS_FILES if (folder / name).is_file()), None)
    args_bytes = args_file.read_bytes() if args_file else b""
    args = _load_yaml(args_bytes)

    ended = (folder / "results.csv").stat().st_mtime
    last_time = rows[-1].get("time")
    if args_file is not None and args_file.stat().st_mtime <= ended:
        started = args_file.stat().st_mtime  # args.yaml is written when the trainer starts
    else:
        started = ended - last_time if last_time is not None else ended
    best = describe.best_row(rows)
    meta: dict[str, Any] = {
        **describe.args_fields(args, str(folder)),
        "model": describe.model_info(args.get("model") or args.get("weights") or args.get("cfg"), None),
        "dataset": _dataset(args, folder),
        "versions": {},
        "result": {
            "best_epoch": int(best["epoch"]) if best else None,
            "best_fitness": describe.fitness(best) if best else None,
            "best_map50_95": describe.map50_95(best) if best else None,
            "speed_ms_per_image": None,
            "final_validation": None,
            "epochs_completed": len(rows),
        },
        "weights": describe.weights_info(folder),
        "imported_from": str(folder),
    }
    run = RunRecord(
        id=import_id(results, args_bytes),
        command=_command(args),
        user=_owner(folder),
        host=socket.gethostname(),
        cwd=str(folder),
        started_at=started,
        ended_at=ended,
        name=folder.name,
        status="imported",
        labels=describe.labels_for(meta),
        meta=meta,
        status_reason=f"imported from {folder}",
        gpu_note="imported run: no resource data was recorded",
    )
    # The folder, its args.yaml (data=URL) and results.csv's columns are text the ledger keeps:
    # redacted as a recorded run's are (core/redaction/records.py).
    redactor = Redactor.default()
    fields = {f.name: getattr(run, f.name) for f in dataclasses.fields(run)}
    run = dataclasses.replace(run, **redact_run_fields(redactor, fields))
    key_of = TextCache(redactor)
    metrics = [
        Metric(
            t=started + row["time"] if "time" in row else ended, key=key_of(key), value=value, epoch=int(row["epoch"])
        )
        for row in rows
        for key, value in describe.epoch_metrics(row).items()
    ]
    return run, metrics


def _live_run_for(ledger: Ledger, save_dir: str, exclude: str) -> str | None:
    for run in ledger.list_runs(limit=5000):
        if run.id != exclude and run.status != "imported" and run.meta.get("save_dir") == save_dir:
            return run.id
    return None


def import_run_dir(ledger: Ledger, path: str | os.PathLike[str], labels: dict[str, str] | None = None) -> ImportResult:
    """Import one run directory; NotARunDirectory with a clear message when it is not one."""
    run, metrics = read_run_dir(path)
    run.labels.update(labels or {})  # given labels win over the automatic model/dataset ones
    created = ledger.create_run(run)
    ledger.append(run.id, metrics=metrics, metric_seq=0)  # seq 0: a resent batch is skipped
    epochs = len({m.epoch for m in metrics})
    return ImportResult(str(Path(path)), run.id, created, epochs, _live_run_for(ledger, run.meta["save_dir"], run.id))
