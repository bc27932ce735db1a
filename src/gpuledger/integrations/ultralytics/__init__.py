"""Ultralytics (YOLOv8, YOLO11, YOLO26 ...) trainings archived epoch by epoch.

Zero code: ``gpuledger run -- yolo train ...`` or ``gpuledger run -- python train.py`` loads the
callbacks into every Ultralytics trainer of the command (integrations/autoload).

Explicit: ``attach(model)`` adds them to one model::

    from ultralytics import YOLO
    from gpuledger.integrations.ultralytics import attach

    model = attach(YOLO("yolo11n.pt"))
    with gpuledger.track(project="detector"):   # optional
        model.train(data="coco8.yaml", epochs=10)

Where the records go: the innermost ``gpuledger.track()`` block of this process if there is one,
else the ``gpuledger run`` around the process. With neither, each ``model.train()`` becomes a run
of its own, metered from the start of the trainer's set-up to its teardown, created with
``attach(model, **options)``'s options (those of ``gpuledger.track``: project, team, labels, db ...).
Such a run ends ``failed`` when the training raises. Under DDP the own run meters the rank-0
process only; use ``gpuledger run`` (or a ``track()`` block) to meter every GPU.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from gpuledger.integrations.ultralytics.callbacks import CALLBACKS, install

__all__ = ["CALLBACKS", "attach", "install"]

_OWN_ATTR = "_gpuledger_own_run"


class _OwnRun:
    """Starts a ``track()`` run for a training nobody else records; closes it at teardown."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options

    def start(self, trainer: Any) -> None:
        from gpuledger.integrations.ultralytics.callbacks import _rank
        from gpuledger.integrations.ultralytics.sink import active_session, current_session, resolve

        try:
            if _rank() not in (-1, 0) or resolve() is not None:
                return
            import gpuledger

            stack = contextlib.ExitStack()
            handle = stack.enter_context(gpuledger.track(**self.options))
            if current_session() is None:  # track() registers itself once api.py is wired; until then
                stack.enter_context(active_session(handle._session))
            setattr(trainer, _OWN_ATTR, stack)
        except Exception:
            pass

    def stop(self, trainer: Any) -> None:
        stack = getattr(trainer, _OWN_ATTR, None)
        if stack is None:
            return
        delattr(trainer, _OWN_ATTR)
        # Called from the trainer's ``finally``: an exception on its way out means the run failed.
        exc = sys.exc_info()
        with contextlib.suppress(Exception):  # the training's own outcome must not change
            stack.__exit__(*exc)


def attach(model: Any, **track_options: Any) -> Any:
    """Add gpuledger's callbacks to an Ultralytics ``YOLO`` model (idempotent); returns the model.

    ``track_options`` are used only when no run is active at training time (see the module doc).
    """
    install(model.callbacks)
    starts = model.callbacks.setdefault("on_pretrain_routine_start", [])
    if not any(isinstance(getattr(cb, "__self__", None), _OwnRun) for cb in starts):
        own = _OwnRun(dict(track_options))
        starts.insert(0, own.start)  # before the callbacks that look for a run
        model.callbacks.setdefault("teardown", []).append(own.stop)
    return model
