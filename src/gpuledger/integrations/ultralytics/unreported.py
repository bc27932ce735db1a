"""The epochs a training wrote to results.csv but no callback reported: taken from the file.

Ultralytics writes an epoch's row of results.csv (``save_metrics``) before it saves the epoch's
checkpoints and only then calls ``on_fit_epoch_end``, where gpuledger's callback reports the
epoch. A training that dies in between (a full disk while saving last.pt, a SIGKILL, an
``on_model_save`` hook that fails) finished that epoch without a report: the ledger would hold
one epoch fewer than the run directory, and a resumed training's attempts would add up short.

At the end of a run whose callbacks reported epochs, the complete rows of its results.csv after
the last epoch reported are recorded as the callbacks would have: the row's columns as the
epoch's metrics, and an ``epoch_end`` (``source: results.csv``) dated when the file was last
written. Rows before the last reported epoch are not taken (a resumed training's earlier
attempts wrote them); a row being written (no line end yet) is not either.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gpuledger.core.model import Metric
from gpuledger.integrations.ultralytics import describe

if TYPE_CHECKING:
    from gpuledger.recorder.session import Session

SOURCE = "results.csv"


def _complete_rows(path: str) -> tuple[list[dict[str, float]], float] | None:
    """results.csv's epochs (describe.complete_epoch_rows) and its modification time; None when
    it cannot be read or is larger than the agent reads (describe.RESULTS_MAX_B)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(describe.RESULTS_MAX_B + 1)
            mtime = os.fstat(fh.fileno()).st_mtime
    except OSError:
        return None
    if len(data) > describe.RESULTS_MAX_B:
        return None
    return describe.complete_epoch_rows(data), mtime


def take_unreported(session: Session, reported: frozenset[int]) -> list[int]:
    """Record the epochs results.csv holds after the last of ``reported``; the epochs taken."""
    save_dir = session.run.meta.get("save_dir")
    if not reported or not isinstance(save_dir, str) or not save_dir:
        return []
    found = _complete_rows(os.path.join(save_dir, "results.csv"))
    if found is None:
        return []
    rows, mtime = found
    last = max(reported)
    taken: list[int] = []
    recorder = session.recorder
    for row in rows:
        n = int(row["epoch"])
        if n <= last or n in taken:
            continue
        metrics = describe.epoch_metrics(row)
        recorder.add_metrics([Metric(t=mtime, key=k, value=v, epoch=n) for k, v in metrics.items()])
        recorder.event_at(mtime, "epoch_end", f"epoch {n} ended", epoch=n, source=SOURCE)
        taken.append(n)
    return taken
