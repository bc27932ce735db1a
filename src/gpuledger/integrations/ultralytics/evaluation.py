"""Evaluations recorded from inside CMD: ``yolo val | predict | benchmark`` and ``model.val()``,
``model.predict()``, ``ultralytics.utils.benchmarks.benchmark()``.

Validator and predictor callbacks (registered with the training ones, callbacks.py) and a wrapper
around ``benchmark`` (installed by the autoload hook) send what was evaluated as run metadata:
``meta.kind = "evaluation"`` and ``meta.evaluation`` (images, Ultralytics' per-image speeds, FPS,
the window, weights and their sha256, the split, imgsz, batch, precision, device, versions,
mAP). Each evaluation is also an ``evaluation`` event, so a script that evaluates several models
keeps them all; ``meta.evaluation`` is the last one. The energy over the window and the split's
fingerprint are added after CMD ends, outside it (eval_postrun.py).

An evaluation's start and end are ``phase`` messages ("evaluation", "after evaluation"): the
recorder closes its interval there, so the window's energy is a sum of whole intervals. Repeated
``predict()`` calls of one predictor (a video loop) add up into one evaluation: their window runs
from the first call's start to the last call's end, only the first start is a phase, and the
metadata is sent at most once a second, the final totals and the one ``evaluation`` event at
exit. Validations inside a training, and the
validations and predictions ``benchmark()`` runs per format, are not evaluations of their own.
A process that trained reports its evaluations as events only: the run stays a training run.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuledger.integrations.ultralytics import describe
from gpuledger.integrations.ultralytics.guard import debug_traceback, rank, safe
from gpuledger.integrations.ultralytics.sink import Sink, resolve

EVALUATION = "evaluation"
AFTER_EVALUATION = "after evaluation"
ATTR = "_gpuledger_evaluation"
SEND_EVERY_S = 1.0
MAX_SOURCE_FILES = 200_000

_trained_here = False
_benchmark_depth = 0
_at_exit: dict[int, Callable[[], None]] = {}  # predictor id -> send its final totals and event


def note_training() -> None:
    """A trainer reported from this process: its evaluations stay events (see the module doc)."""
    global _trained_here
    _trained_here = True


def _source() -> str:
    """``wrapped``: the ``yolo`` command line; ``python-api``: a Python program calling Ultralytics."""
    return "wrapped" if Path(sys.argv[0] if sys.argv else "").name in ("yolo", "ultralytics") else "python-api"


def _versions() -> dict[str, Any]:
    found: dict[str, Any] = {"ultralytics": None, "torch": None, "cuda": None}
    for name in ("ultralytics", "torch"):
        found[name] = getattr(sys.modules.get(name), "__version__", None)
    torch = sys.modules.get("torch")
    found["cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
    return found


def precision(args: Any) -> str:
    """fp32, half or int8, from ``quantize`` (Ultralytics >= 8.4) or ``half``/``int8`` (earlier)."""
    quantize = str(getattr(args, "quantize", None) or "").lower()
    if quantize in ("16", "fp16", "half") or getattr(args, "half", False):
        return "half"
    if quantize in ("8", "int8") or getattr(args, "int8", False):
        return "int8"
    return "fp32"


def _gpu_model(device: Any) -> str | None:
    torch = sys.modules.get("torch")
    if torch is None or getattr(device, "type", str(device).split(":")[0]) != "cuda":
        return None
    try:
        return str(torch.cuda.get_device_name(device))
    except Exception:
        return None


def weights(model: Any) -> dict[str, Any] | None:
    text = str(model) if isinstance(model, (str, os.PathLike)) else None
    if not text or text.endswith((".yaml", ".yml")) or not Path(text).is_file():
        return None
    return {"path": str(Path(text).resolve()), "sha256": describe.sha256_file(text)}


def _map(results: dict[str, Any]) -> tuple[float | None, float | None]:
    def first(prefix: str) -> float | None:
        value = next((v for k, v in results.items() if k.startswith(prefix)), None)
        return None if value is None else float(value)

    return first("metrics/mAP50("), first("metrics/mAP50-95(")


def square(imgsz: Any) -> Any:
    """``[640, 640]`` (the predictor's form) as ``640`` (the validator's), so the two compare equal."""
    if isinstance(imgsz, (list, tuple)) and imgsz and all(v == imgsz[0] for v in imgsz):
        return imgsz[0]
    return imgsz


def _finish(record: dict[str, Any], images: int | None, t0: float, t1: float) -> dict[str, Any]:
    speed = record.get("ms_per_image") or {}
    inference = speed.get("inference")
    record.update(
        imgsz=square(describe.jsonable(record.get("imgsz"))),
        images=images,
        window=[t0, t1],
        fps_end_to_end=images / (t1 - t0) if images and t1 > t0 else None,
        fps_inference=1000.0 / inference if inference else None,
        versions=_versions(),
    )
    return describe.jsonable(record)


def _report(sink: Sink, record: dict[str, Any], labels: dict[str, str], event: bool = True) -> None:
    if event:
        payload = {k: v for k, v in record.items() if k != "benchmark"}
        message = f"{record['mode']} of {record.get('images') or '?'} images"
        sink.send("event", kind=EVALUATION, message=message, payload=payload)
    if not _trained_here:
        sink.send("metadata", labels=labels, meta={"kind": EVALUATION, "evaluation": record})


TRAINER_NAMES = ("best", "last")  # the weights a training saves in SAVE_DIR/weights/
ARGS_MAX_B = 1 << 20


def model_name(weights_path: str) -> str:
    """The model label of evaluated weights: the file's name, but for a training's own best.pt or
    last.pt the model that training was given (its args.yaml, next to weights/), so an evaluation
    is ``model=yolov8n`` as its training is, not ``model=best``."""
    path = Path(weights_path)
    if path.stem not in TRAINER_NAMES or path.parent.name != "weights":
        return path.stem
    try:
        import yaml  # PyYAML: an Ultralytics dependency

        with open(path.parent.parent / "args.yaml", "rb") as fh:
            args = yaml.safe_load(fh.read(ARGS_MAX_B).decode("utf-8", "replace"))
    except Exception:  # no args.yaml, or not one Ultralytics wrote: the file's name stands
        return path.stem
    given = args.get("model") if isinstance(args, dict) else None
    named = Path(given).stem if isinstance(given, str) and given else ""
    # a resumed training was given its own last.pt: that names no model
    return named if named and named not in TRAINER_NAMES else path.stem


def _labels(record: dict[str, Any]) -> dict[str, str]:
    labels = {}
    model = (record.get("weights") or {}).get("path")
    if model:
        labels["model"] = model_name(model)
    data = (record.get("split") or {}).get("data")
    if data:
        name = describe.dataset_info({"yaml_file": data}, data, {}).get("name")
        if name:
            labels["dataset"] = str(name)
    return labels


# -- validation --------------------------------------------------------------------------------


def on_val_start(validator: Any) -> None:
    """Called by callbacks.on_val_start when no training is in progress."""
    if getattr(validator, "training", True) or _benchmark_depth:
        return
    sink = resolve()
    if sink is None:
        return
    setattr(validator, ATTR, (sink, time.time()))
    sink.send("phase", name=EVALUATION)


def val_record(validator: Any, t0: float, t1: float) -> dict[str, Any]:
    args = validator.args
    data = getattr(validator, "data", None) or {}
    try:
        images: int | None = len(validator.dataloader.dataset)
    except Exception:
        images = getattr(validator, "seen", None)
    speed = {k: float(v) for k, v in (getattr(validator, "speed", None) or {}).items() if k != "loss"}
    metrics = getattr(validator, "metrics", None)
    results = dict(getattr(metrics, "results_dict", None) or {})
    map50, map50_95 = _map(results)
    yaml_file = data.get("yaml_file") or getattr(args, "data", None)
    split = getattr(args, "split", None) or "val"
    record: dict[str, Any] = {
        "mode": "val",
        "source": _source(),
        "ms_per_image": speed or None,
        "weights": weights(getattr(args, "model", None)),
        "split": {
            "name": split,
            "data": str(Path(str(yaml_file)).resolve()) if yaml_file else None,
            "path": str(data["path"]) if data.get("path") else None,
        },
        "imgsz": getattr(args, "imgsz", None),
        "batch": getattr(getattr(validator, "dataloader", None), "batch_size", None) or getattr(args, "batch", None),
        "precision": precision(args),
        "device": str(getattr(validator, "device", None) or getattr(args, "device", "")),
        "gpu_model": _gpu_model(getattr(validator, "device", None)),
        "task": getattr(args, "task", None),
        "map50": map50,
        "map50_95": map50_95,
    }
    return _finish(record, images, t0, t1)


@safe
def on_val_end(validator: Any) -> None:
    started = getattr(validator, ATTR, None)
    if started is None:
        return
    delattr(validator, ATTR)
    sink, t0 = started
    t1 = time.time()
    sink.send("phase", name=AFTER_EVALUATION)
    record = val_record(validator, t0, t1)
    _report(sink, record, _labels(record))


# -- prediction --------------------------------------------------------------------------------


class _Predictions:
    """One predictor's calls, added up."""

    def __init__(self, sink: Sink, t0: float) -> None:
        self.sink = sink
        self.t0 = self.t1 = self.call_t0 = t0
        self.images = 0
        self.calls = 0
        self.split: dict[str, Any] | None = None
        self.ms_total = {"preprocess": 0.0, "inference": 0.0, "postprocess": 0.0}
        self.last_sent = 0.0
        self.record: dict[str, Any] | None = None

    def add(self, predictor: Any, t1: float) -> None:
        seen = int(getattr(predictor, "seen", 0) or 0)
        split = _predict_source(predictor)
        self.split = split if self.calls == 0 or split == self.split else None  # one source for all calls
        self.calls += 1
        speed = getattr(predictor, "speed", None) or {}
        for key in self.ms_total:
            self.ms_total[key] += float(speed.get(key) or 0.0) * seen
        self.images += seen
        self.t1 = t1
        args = predictor.args
        ms = {k: v / self.images for k, v in self.ms_total.items()} if self.images else None
        batch = getattr(getattr(predictor, "dataset", None), "bs", None) or getattr(args, "batch", None)
        record: dict[str, Any] = {
            "mode": "predict",
            "source": _source(),
            "ms_per_image": ms,
            "weights": weights(getattr(args, "model", None)),
            "split": self.split,
            "imgsz": describe.jsonable(getattr(predictor, "imgsz", None) or getattr(args, "imgsz", None)),
            "batch": batch,
            # AutoBackend knows whether it runs in half precision (the args may only have asked)
            "precision": "half" if getattr(getattr(predictor, "model", None), "fp16", False) else precision(args),
            "device": str(getattr(predictor, "device", None) or getattr(args, "device", "")),
            "gpu_model": _gpu_model(getattr(predictor, "device", None)),
            "task": getattr(args, "task", None),
            "map50": None,
            "map50_95": None,
        }
        self.record = _finish(record, self.images or None, self.t0, self.t1)

    def send(self, event: bool = False) -> None:
        """The totals so far as the run's metadata; with ``event``, also as the evaluation event
        (once, at exit: a video loop must not leave an event per second)."""
        if self.record is not None:
            self.last_sent = time.time()
            _report(self.sink, self.record, _labels(self.record), event=event)


def _predict_source(predictor: Any) -> dict[str, Any] | None:
    """The folder the predicted images came from (fingerprinted after the run), when there is one."""
    files = getattr(getattr(predictor, "dataset", None), "files", None)
    if not files or len(files) > MAX_SOURCE_FILES or not all(isinstance(f, str) for f in files):
        return None
    try:
        folder = os.path.commonpath([os.path.abspath(f) for f in files])
    except ValueError:
        return None
    if not os.path.isdir(folder):
        return None  # one image: its folder may hold others that were not predicted
    from gpuledger.integrations.ultralytics.fingerprint import source_files

    if len(source_files(folder).images) != len(set(files)):
        return None  # some of a folder's images (a glob): the fingerprint would cover the others too
    return {"name": "source", "data": None, "path": folder}


@safe
def on_predict_start(predictor: Any) -> None:
    if _benchmark_depth:
        return
    now = time.time()
    acc = getattr(predictor, ATTR, None)
    if acc is None:
        sink = resolve()
        if sink is None:
            return
        acc = _Predictions(sink, now)
        setattr(predictor, ATTR, acc)
        sink.send("phase", name=EVALUATION)
    acc.call_t0 = now


@safe
def on_predict_end(predictor: Any) -> None:
    acc = getattr(predictor, ATTR, None)
    if acc is None or _benchmark_depth:
        return
    acc.add(predictor, time.time())
    _at_exit[id(predictor)] = lambda: acc.send(event=True)
    if time.time() - acc.last_sent >= SEND_EVERY_S:
        acc.send()


@atexit.register
def _send_at_exit() -> None:
    for send in list(_at_exit.values()):
        try:
            send()
        except Exception:
            debug_traceback()
    _at_exit.clear()


# -- benchmark ---------------------------------------------------------------------------------


def _table_rows(table: Any) -> list[dict[str, Any]]:
    """``meta.evaluation.benchmark`` from the table ``benchmark()`` returned (strings, "-" = none)."""
    from gpuledger.core.evaluation.console import parse_benchmark

    parsed = parse_benchmark(str(table)) if table is not None else None
    return parsed["rows"] if parsed else []


def _data_path(data: Any) -> str | None:
    if not data:
        return None
    return str(Path(str(data)).resolve()) if Path(str(data)).is_file() else str(data)


def benchmark_record(
    fn: Callable[..., Any], call_args: tuple, kwargs: dict[str, Any], table: Any, t0: float, t1: float
) -> dict[str, Any]:
    import inspect

    bound = inspect.signature(fn).bind_partial(*call_args, **kwargs)  # with the signature's defaults
    bound.apply_defaults()
    given = bound.arguments
    extra = given.get("kwargs") or {}
    model = given.get("model")
    path = getattr(model, "ckpt_path", None) or getattr(model, "pt_path", None) or model
    data = given.get("data")

    class _Args:  # precision() reads attributes
        quantize = given.get("quantize") or extra.get("quantize")
        half = extra.get("half", False)
        int8 = extra.get("int8", False)

    rows = _table_rows(table)
    record: dict[str, Any] = {
        "mode": "benchmark",
        "source": _source(),
        "ms_per_image": None,
        "weights": weights(path),
        "split": {"name": "val", "data": _data_path(data), "path": None},
        "imgsz": given.get("imgsz"),
        "batch": 1,  # benchmark() validates every format with batch=1
        "precision": precision(_Args),
        "device": str(given.get("device")),
        "gpu_model": None,
        "map50": None,
        "map50_95": None,
        "benchmark": rows,
    }
    return _finish(record, None, t0, t1)


def wrap_benchmark(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``ultralytics.utils.benchmarks.benchmark`` reporting its table as the run's evaluation."""
    if getattr(fn, "_gpuledger", False):
        return fn
    import functools

    @functools.wraps(fn)
    def benchmark(*args: Any, **kwargs: Any) -> Any:
        global _benchmark_depth
        sink = resolve() if rank() in (-1, 0) and not _benchmark_depth else None
        t0 = time.time()
        if sink is not None:
            sink.send("phase", name=EVALUATION)
        _benchmark_depth += 1
        try:
            table = fn(*args, **kwargs)
        finally:
            _benchmark_depth -= 1
        if sink is not None:
            try:
                t1 = time.time()
                sink.send("phase", name=AFTER_EVALUATION)
                record = benchmark_record(fn, args, kwargs, table, t0, t1)
                _report(sink, record, _labels(record))
            except Exception:
                debug_traceback()
        return table

    benchmark._gpuledger = True  # type: ignore[attr-defined]
    return benchmark
