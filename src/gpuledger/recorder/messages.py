"""What the recorder does with each control message sent from inside CMD (see control.py).

Types: ``epoch_start`` {epoch}, ``epoch_end`` {epoch, metrics, payload}, ``phase`` {name} (a span
after the epochs, e.g. "final validation"): each closes the current interval first, so usage can be
summed per epoch exactly (core/training/epochs.py). ``metrics`` {metrics, epoch|step}; ``event`` {kind,
message, payload}; ``metadata`` {labels, meta}; ``attempt_of`` {run_id}; ``resume_of`` {save_dir}:
link this run to the latest earlier run that wrote to the same save_dir (a resumed training).

``handle(..., cut=False)`` is for messages applied from another thread (the in-process ``track()``
session): everything but the interval cut is thread-safe.
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING

from gpuledger.core.model import Metric

if TYPE_CHECKING:
    from gpuledger.recorder.recorder import Recorder
    from gpuledger.recorder.session import Session

# The epochs whose end a session received: tells the end of the run whether the log must be parsed
# (none) and which rows of results.csv no callback reported (integrations/ultralytics/unreported.py).
_epoch_ends: weakref.WeakKeyDictionary[Session, set[int]] = weakref.WeakKeyDictionary()


def epochs_ended(session: Session) -> frozenset[int]:
    return frozenset(_epoch_ends.get(session, ()))


def _metrics(msg: dict, epoch: int | None, step: int | None) -> list[Metric]:
    t = float(msg.get("t") or 0.0)
    out = []
    for key, value in (msg.get("metrics") or {}).items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        out.append(Metric(t=t, key=str(key), value=number, epoch=epoch, step=step))
    return out


def handle(session: Session, recorder: Recorder, msg: dict, cut: bool = True) -> None:
    kind = msg["type"]
    if kind == "epoch_end":
        epoch = int(msg["epoch"])
        if cut:
            recorder.cut()  # the interval ends exactly at the epoch boundary
        metrics = _metrics(msg, epoch, None)
        recorder.add_metrics(metrics)
        bad = [m.key for m in metrics if not math.isfinite(m.value)]
        recorder.event("epoch_end", f"epoch {epoch} ended", **{**(msg.get("payload") or {}), "epoch": epoch})
        if bad:
            recorder.event("nan_loss", f"non-finite {', '.join(bad)} at epoch {epoch}", epoch=epoch, keys=bad)
        _epoch_ends.setdefault(session, set()).add(epoch)
    elif kind in ("epoch_start", "phase"):
        if cut:
            recorder.cut()
        if kind == "phase":
            name = str(msg.get("name") or "phase")
            recorder.event("phase", name, name=name)
        else:
            recorder.event("epoch_start", f"epoch {msg.get('epoch')} started", epoch=msg.get("epoch"))
    elif kind == "metrics":
        recorder.add_metrics(_metrics(msg, msg.get("epoch"), msg.get("step")))
    elif kind == "event":
        recorder.event(str(msg.get("kind", "note")), str(msg.get("message", "")), **(msg.get("payload") or {}))
    elif kind == "metadata":
        session.update_meta(labels=msg.get("labels") or {}, meta=msg.get("meta") or {})
    elif kind == "attempt_of":
        session.link_attempt(str(msg["run_id"]))
    elif kind == "resume_of":
        from gpuledger.runs.attempts import find_earlier_attempt

        earlier = find_earlier_attempt(session.ledger(), str(msg["save_dir"]), before=session.run)
        if earlier is not None:
            session.link_attempt(earlier.id)
            recorder.event("resumed", f"resumes run {earlier.id}", attempt_of=earlier.id, save_dir=msg["save_dir"])
