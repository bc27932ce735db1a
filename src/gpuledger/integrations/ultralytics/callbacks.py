"""Ultralytics trainer callbacks that archive a training epoch by epoch into the current run.

What each callback sends (see recorder/messages.py for what the recorder does with it):

- ``on_pretrain_routine_end``: ``metadata`` (hyper-parameters, model, dataset ..., labels ``model``
  and ``dataset``), and ``resume_of`` when the training resumes a checkpoint.
- ``on_train_epoch_start``: ``epoch_start``; ``on_fit_epoch_end``: ``epoch_end`` with the row the
  trainer just wrote to results.csv (same keys, same values) and the epoch's images and timings.
  Ultralytics calls ``on_fit_epoch_end`` once more after training for the best weights' validation;
  that call is recognised (no ``on_train_epoch_start`` before it) and kept as the final result.
- ``on_val_start`` of the final validation: ``phase`` "final validation"; ``on_train_end``:
  ``phase`` "after training", then the results (best epoch, speed, weight files).

Only the process of rank -1 or 0 reports (DDP: metadata and metrics once; the recorder meters all
GPUs anyway). Every callback swallows its own errors: a broken archive must not break a training.
Set ``GPULEDGER_DEBUG=1`` to see them on stderr.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, MutableMapping
from typing import Any

from gpuledger.integrations.ultralytics import describe, evaluation, guard
from gpuledger.integrations.ultralytics.sink import Sink, resolve

STATE_ATTR = "_gpuledger_state"
FINAL_VALIDATION = "final validation"
AFTER_TRAINING = "after training"


class _State:
    """What the callbacks remember about one trainer."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.epoch: int | None = None  # trainer.epoch (0-based) of the epoch in progress
        self.epoch_t0 = 0.0
        self.train_s: float | None = None
        self.sent: set[int] = set()  # epochs (1-based) already reported
        self.final: dict[str, Any] = {}  # the final validation's metrics
        self.final_phase_sent = False
        self.best_epoch: int | None = None  # the last epoch whose weights went to best.pt


# The training in progress in this process: validator callbacks only get the validator.
_current: _State | None = None


_rank = guard.rank
_safe = guard.safe


def _state(trainer: Any, create: bool = True) -> _State | None:
    global _current
    state = getattr(trainer, STATE_ATTR, None)
    if state is None and create:
        sink = resolve()
        if sink is None:
            return None
        state = _State(sink)
        setattr(trainer, STATE_ATTR, state)
        evaluation.note_training()
    if state is not None:
        _current = state
    return state


def _unwrap(model: Any) -> Any:
    return getattr(model, "module", model)


def _parameters(trainer: Any) -> int | None:
    try:
        return int(sum(p.numel() for p in _unwrap(trainer.model).parameters()))
    except Exception:
        return None


def _architecture(trainer: Any) -> str | None:
    """The model YAML the network was built from (``yolov8n``), kept inside every checkpoint."""
    try:
        yaml_file = _unwrap(trainer.model).yaml.get("yaml_file")
    except Exception:
        return None
    if not yaml_file:
        return None
    return os.path.splitext(os.path.basename(str(yaml_file)))[0] or None


def _model(trainer: Any) -> dict[str, Any]:
    info = describe.model_info(getattr(trainer.args, "model", None), _parameters(trainer))
    if getattr(trainer.args, "resume", False) and getattr(trainer, "start_epoch", 0) > 0:
        # A resumed training's source is its own last.pt: named by the file, every attempt after
        # the first would be model "last"; the architecture names it as the first attempt was.
        info["name"] = _architecture(trainer) or info["name"]
    return info


def _len(loader: Any) -> int | None:
    try:
        return len(loader.dataset)
    except Exception:
        return None


def _versions() -> dict[str, str]:
    found = {}
    for name in ("ultralytics", "torch"):
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None)
        if version:
            found[name] = str(version)
    return found


def trainer_meta(trainer: Any) -> dict[str, Any]:
    args = trainer.args
    data = getattr(trainer, "data", None) or {}
    save_dir = os.path.abspath(str(trainer.save_dir))
    images = {
        "train": _len(getattr(trainer, "train_loader", None)),
        "val": _len(getattr(trainer, "test_loader", None)),
        "test": describe.count_images(data.get("test"), data.get("path")),
    }
    args_yaml = None
    yaml_path = os.path.join(save_dir, "args.yaml")
    if os.path.exists(yaml_path):
        import yaml  # PyYAML: an Ultralytics dependency, stable across Ultralytics versions

        with open(yaml_path, encoding="utf-8", errors="replace") as fh:
            args_yaml = describe.jsonable(yaml.safe_load(fh))
    return {
        "framework": "ultralytics",
        "task": getattr(args, "task", None),
        "save_dir": save_dir,
        "imgsz": describe.jsonable(getattr(args, "imgsz", None)),
        "batch": describe.jsonable(getattr(trainer, "batch_size", getattr(args, "batch", None))),
        "epochs": getattr(trainer, "epochs", getattr(args, "epochs", None)),
        "device": str(getattr(trainer, "device", getattr(args, "device", ""))),
        "world_size": getattr(trainer, "world_size", None),
        "start_epoch": getattr(trainer, "start_epoch", 0) + 1,
        "hyperparameters": describe.jsonable(vars(args)),
        "args_yaml": args_yaml,
        "model": _model(trainer),
        "dataset": describe.dataset_info(data, getattr(args, "data", None), images),
        "versions": _versions(),
    }


@_safe
def on_pretrain_routine_start(trainer: Any) -> None:
    _state(trainer)


@_safe
def on_pretrain_routine_end(trainer: Any) -> None:
    state = _state(trainer)
    if state is None:
        return
    meta = trainer_meta(trainer)
    labels = describe.labels_for(meta)
    if not state.sink.send("metadata", labels=labels, meta=meta):
        # Too big for one datagram (thousands of class names?): send the essentials.
        meta.pop("args_yaml", None)
        meta["dataset"]["classes"] = meta["dataset"]["classes"][:100]
        state.sink.send("metadata", labels=labels, meta=meta)
    if getattr(trainer.args, "resume", False) and getattr(trainer, "start_epoch", 0) > 0:
        state.sink.send("resume_of", save_dir=meta["save_dir"])


@_safe
def on_train_epoch_start(trainer: Any) -> None:
    state = _state(trainer)
    if state is None:
        return
    state.epoch, state.epoch_t0, state.train_s = trainer.epoch, time.time(), None
    state.sink.send("epoch_start", epoch=trainer.epoch + 1)


@_safe
def on_train_epoch_end(trainer: Any) -> None:
    state = _state(trainer, create=False)
    if state is not None and state.epoch == trainer.epoch:
        state.train_s = time.time() - state.epoch_t0


def _row_from_trainer(trainer: Any) -> dict[str, float]:
    """The row BaseTrainer.save_metrics writes, rebuilt (when results.csv cannot be read)."""
    metrics = {**trainer.label_loss_items(trainer.tloss), **(trainer.metrics or {}), **(trainer.lr or {})}
    row = {"time": time.time() - trainer.train_time_start, **metrics}
    return {k: float(f"{float(v):.6g}") for k, v in row.items()}


@_safe
def on_fit_epoch_end(trainer: Any) -> None:
    state = _state(trainer, create=False)
    if state is None:
        return
    epoch = trainer.epoch + 1
    if state.epoch != trainer.epoch or epoch in state.sent:
        # Ultralytics' extra call after training (final_eval bumps trainer.epoch): not an epoch.
        state.final = describe.jsonable(dict(trainer.metrics or {}))
        return
    row = describe.last_results_row(trainer.csv)
    if row is not None and row.get("epoch") == epoch:
        metrics = describe.epoch_metrics(row)
    else:
        metrics = _row_from_trainer(trainer)
    images = _len(getattr(trainer, "train_loader", None))
    payload: dict[str, Any] = {
        "images": images,
        "train_s": state.train_s,
        "images_per_s": images / state.train_s if images and state.train_s else None,
        "epoch_s": getattr(trainer, "epoch_time", None),
        "batch": getattr(trainer, "batch_size", None),
        "epochs": getattr(trainer, "epochs", None),
    }
    state.sink.send("epoch_end", epoch=epoch, metrics=metrics, payload=payload)
    state.sent.add(epoch)
    fitness = getattr(trainer, "fitness", None)
    if fitness is not None and getattr(trainer, "best_fitness", None) == fitness:
        # save_model's own test: best.pt now holds this epoch, also on a tie with an earlier one
        # (the stopper keeps the first of equal epochs, so its best_epoch is not best.pt's)
        state.best_epoch = epoch


@_safe
def on_val_start(validator: Any) -> None:
    state = _current
    if state is None:  # no training in progress: model.val() / yolo val, an evaluation
        evaluation.on_val_start(validator)
        return
    if state.sent and not state.final_phase_sent and not getattr(validator, "training", True):
        state.final_phase_sent = True
        state.sink.send("phase", name=FINAL_VALIDATION)


def _result(trainer: Any, state: _State) -> dict[str, Any]:
    rows = describe.read_results_csv(trainer.csv)
    stopper = getattr(trainer, "stopper", None)
    best_epoch = state.best_epoch or getattr(stopper, "best_epoch", None)
    best = next((r for r in rows if r.get("epoch") == best_epoch), None) if best_epoch else None
    if best is None:
        best = describe.best_row(rows)
    validator = getattr(trainer, "validator", None)
    speed = getattr(validator, "speed", None)
    fitness = getattr(trainer, "best_fitness", None)
    return describe.jsonable(
        {
            "best_epoch": int(best["epoch"]) if best and "epoch" in best else best_epoch,
            "best_fitness": float(fitness) if fitness is not None else None,
            "best_map50_95": describe.map50_95(best) if best else None,
            "speed_ms_per_image": dict(speed) if speed else None,
            "final_validation": state.final or None,
            "epochs_completed": len(rows),
        }
    )


@_safe
def on_train_end(trainer: Any) -> None:
    state = _state(trainer, create=False)
    if state is None:
        return
    state.sink.send("phase", name=AFTER_TRAINING)
    meta = {"result": _result(trainer, state), "weights": describe.weights_info(trainer.save_dir)}
    state.sink.send("metadata", labels={}, meta=meta)


@_safe
def teardown(trainer: Any) -> None:
    global _current
    if _current is getattr(trainer, STATE_ATTR, None):
        _current = None


CALLBACKS: dict[str, Callable[[Any], None]] = {
    "on_pretrain_routine_start": on_pretrain_routine_start,
    "on_pretrain_routine_end": on_pretrain_routine_end,
    "on_train_epoch_start": on_train_epoch_start,
    "on_train_epoch_end": on_train_epoch_end,
    "on_fit_epoch_end": on_fit_epoch_end,
    "on_val_start": on_val_start,
    "on_val_end": evaluation.on_val_end,
    "on_predict_start": evaluation.on_predict_start,
    "on_predict_end": evaluation.on_predict_end,
    "on_train_end": on_train_end,
    "teardown": teardown,
}


def install(callbacks: MutableMapping[str, list]) -> None:
    """Add gpuledger's callbacks to an Ultralytics callbacks dict (default_callbacks or a model's)."""
    for event, fn in CALLBACKS.items():
        registered = callbacks.setdefault(event, [])
        if fn not in registered:
            registered.append(fn)
