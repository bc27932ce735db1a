"""The end of an evaluation run: what only the recorder can add, once CMD has ended.

Called from postrun.explain_run (the session's ``explain`` hook: the recorder has stopped and
written its intervals). It completes ``meta.evaluation``:

- energy, mean and peak power, busy share and J/image over the evaluation's window, from the
  run's GPU intervals (core/evaluation/window.py), and the GPU model from the run's devices;
- the split's fingerprint (fingerprint.py; file hashes cached between runs);
- without callbacks (a Python the hook could not load into): an evaluation read from the console
  output (core/evaluation/console.py) when the command is ``yolo val|predict|benchmark`` or the
  output holds a benchmark table. Its window is then the whole run (the evaluated span is not
  printed), so its energy includes the model's loading.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuledger.core.evaluation import console
from gpuledger.core.evaluation.window import window_usage
from gpuledger.core.model import GpuInterval
from gpuledger.core.training.candidates import holds_marker, whole
from gpuledger.integrations.ultralytics import fingerprint
from gpuledger.integrations.ultralytics.describe import sha256_file
from gpuledger.integrations.ultralytics.evaluation import EVALUATION
from gpuledger.integrations.ultralytics.file_hashes import FileHashes

if TYPE_CHECKING:
    import mmap

    from gpuledger.recorder.session import Session

MODES = ("val", "predict", "benchmark")


def _intervals(session: Session) -> list[GpuInterval]:
    found: dict[tuple[str, int], GpuInterval] = {}
    with contextlib.suppress(Exception):  # an unreachable ledger: what is still pending
        for iv in session.ledger().gpu_intervals(session.run.id):
            found[(iv.device_uuid, iv.seq)] = iv
    for iv in session.recorder.pending.gpu:
        found[(iv.device_uuid, iv.seq)] = iv
    return list(found.values())


def add_usage(record: dict[str, Any], intervals: Sequence[GpuInterval]) -> None:
    window = record.get("window")
    if not window or len(window) != 2:
        return
    usage = window_usage(intervals, float(window[0]), float(window[1]))
    record.update(
        energy_j=usage.energy_j,
        j_per_image=usage.per_image_j(record.get("images")),
        power_mean_w=usage.power_mean_w,
        power_peak_w=usage.power_peak_w,
        busy_share=usage.busy_share,
    )


def add_fingerprint(record: dict[str, Any], cwd: str, hashes: FileHashes) -> None:
    split = record.get("split")
    if not isinstance(split, dict) or split.get("fingerprint"):
        return
    try:
        if split.get("data"):
            files = fingerprint.resolve_split(split["data"], split.get("name") or "val", split.get("path"), cwd=cwd)
        elif split.get("path"):  # a prediction's source folder: its images
            files = fingerprint.source_files(split["path"], split.get("name") or "source")
        else:
            return
        split.update(fingerprint.fingerprint_split(files, hashes))
    except (OSError, ValueError) as exc:
        split["fingerprint"] = None
        split["fingerprint_error"] = str(exc)[:300]


# -- without callbacks: the console ----------------------------------------------------------


def _yolo_args(command: Sequence[str]) -> tuple[str | None, dict[str, str]]:
    """The mode and ``key=value`` arguments of a ``yolo [task] mode k=v ...`` command line."""
    words = list(command)
    if len(words) >= 3 and Path(words[0]).name in ("bash", "sh") and words[1] == "-c":
        words = shlex.split(words[2])
    at = next((i for i, w in enumerate(words) if Path(w).name in ("yolo", "ultralytics")), None)
    if at is None:
        return None, {}
    mode = next((w for w in words[at + 1 : at + 3] if w in MODES), None)
    args = dict(w.split("=", 1) for w in words[at + 1 :] if "=" in w)
    return mode, args


def _int(text: str | None) -> int | None:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return None


def console_record(
    log: bytes | mmap.mmap, command: Sequence[str], started: float, ended: float, mode: str | None = None
) -> tuple[dict[str, Any], dict[str, str]] | None:
    """The evaluation the console shows and the command's ``key=value`` arguments, reading no
    file (paths stay as printed: the node agent maps a container's through its mounts). ``mode``
    overrides the one the command names (output read without a ``yolo`` command line)."""
    named, args = _yolo_args(command)
    mode = mode or named
    parsed: dict[str, Any] | None = None
    if mode == "benchmark" or (mode is None and holds_marker(log)):
        table = console.parse_benchmark(whole(log))
        if table:
            mode = "benchmark"
            parsed = {"benchmark": table["rows"], "imgsz": table["imgsz"], "images": None, "ms_per_image": None}
            args.setdefault("model", table["model"] or "")
            args.setdefault("data", table["data"] or "")
    elif mode == "val":
        parsed = console.parse_val(whole(log))
    elif mode == "predict":
        parsed = console.parse_predict(whole(log))
    if parsed is None:
        return None
    record: dict[str, Any] = {
        "mode": mode,
        "source": "console",
        "map50": None,
        "map50_95": None,
        **parsed,
        "weights": None,
        "imgsz": parsed.get("imgsz") or _int(args.get("imgsz")),
        "batch": parsed.get("batch") or _int(args.get("batch")),
        "precision": "half" if args.get("half") in ("True", "true") or args.get("quantize") in ("16", "fp16") else
        "int8" if args.get("int8") in ("True", "true") or args.get("quantize") in ("8", "int8") else "fp32",
        "device": args.get("device"),
        "window": [started, ended],
    }  # fmt: skip
    speed = record.get("ms_per_image") or {}
    images = record.get("images")
    record["fps_inference"] = 1000.0 / speed["inference"] if speed.get("inference") else None
    record["fps_end_to_end"] = images / (ended - started) if images and ended > started else None
    return record, args


def from_console(
    log: bytes | mmap.mmap, command: Sequence[str], cwd: str, started: float, ended: float
) -> dict[str, Any] | None:
    found = console_record(log, command, started, ended)
    if found is None:
        return None
    record, args = found
    mode = record["mode"]

    def path(key: str) -> str | None:
        value = args.get(key)
        if not value:
            return None
        return str(Path(cwd, value).resolve()) if Path(cwd, value).exists() else value

    model = path("model")
    record["weights"] = {"path": model, "sha256": sha256_file(model)} if model and os.path.isfile(model) else None
    if mode in ("val", "benchmark") and args.get("data"):
        record["split"] = {"name": args.get("split") or "val", "data": path("data"), "path": None}
    elif mode == "predict" and args.get("source") and os.path.isdir(path("source") or ""):
        record["split"] = {"name": "source", "data": None, "path": path("source")}
    return record


def complete_evaluation(session: Session, log: bytes | mmap.mmap) -> None:
    """Fill in ``meta.evaluation`` (see the module doc); never raises into the end of the run."""
    run = session.run
    record = run.meta.get("evaluation")
    labels: dict[str, str] = {}
    if not isinstance(record, dict):
        if run.meta.get("framework") == "ultralytics" and run.meta.get("epochs") is not None:
            return  # a training whose epochs came from the callbacks
        ended = session.recorder.last_reading_t or run.started_at
        record = from_console(log, run.command, run.cwd, run.started_at, ended)
        if record is None:
            return
    record = dict(record)
    add_usage(record, _intervals(session))
    device = str(record.get("device") or "")
    if not record.get("gpu_model") and session.devices and not device.startswith(("cpu", "mps")):
        record["gpu_model"] = session.devices[0].name
    with FileHashes() as hashes:
        add_fingerprint(record, run.cwd, hashes)
    session.update_meta(labels=labels, meta={"kind": EVALUATION, "evaluation": record})
    session.recorder.flush(force=True)  # the run's meta is written with the flush
