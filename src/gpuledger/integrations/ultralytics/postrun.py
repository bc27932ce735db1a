"""The end of a ``gpuledger run``: explain a failure and, without callbacks, read epochs from the log.

``explain_run`` is called by the session once CMD has ended and the recorder has stopped, before
the run's end state is written (Session.finish's ``explain`` hook). It:

1. is handed CMD's log, as the session stores it (whole, or its head and tail around a marker:
   core/training/logcap.py; failures are at the end, which is kept),
2. records failures found there (CUDA OOM, NaN loss, dataset not found, OOM killer: core/training/failures.py)
   as run events with the epoch they happened in, and returns the one-line reason for the status,
3. completes an evaluation run's ``meta.evaluation`` (energy over its window, the split's
   fingerprint; read from the output when no callback reported it): eval_postrun.py,
4. when no ``epoch_end`` came from the callbacks (YOLOv5 scripts, a Python the hook could not load
   into), parses the training output into per-epoch metrics (core/training/logparse.py); when some
   did, takes the epochs results.csv holds after the last one reported (unreported.py),
5. records a training's place in its model's line (``meta.lineage``: lineage.py).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import TYPE_CHECKING

from gpuledger.core.model import Metric
from gpuledger.core.training import failures
from gpuledger.integrations.ultralytics.eval_postrun import complete_evaluation
from gpuledger.integrations.ultralytics.guard import debug_traceback
from gpuledger.integrations.ultralytics.lineage import record_lineage
from gpuledger.integrations.ultralytics.unreported import take_unreported

if TYPE_CHECKING:
    import mmap

    from gpuledger.recorder.session import Session


def memory_limit_b() -> int | None:
    """The memory limit CMD ran under: its cgroup's, else the machine's RAM."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # cgroup v1 says "no limit" with a huge number
            return int(text)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _rss_peak_b(session: Session, exit_code: int | None, signal: int | None) -> int | None:
    if not failures.killed_by_sigkill(exit_code, signal):
        return None  # only the OOM-killer verdict weighs it; reading the ledger's totals costs a quick run
    peaks = [h.rss_max_b for h in session.recorder.pending.host]
    with contextlib.suppress(Exception):  # an unreachable ledger leaves the pending intervals
        peaks.append(session.ledger().host_totals(session.run.id).get("rss_max_b") or 0)
    return max(peaks) if peaks else None


def explain_run(
    session: Session, log: bytes | mmap.mmap, status: str, exit_code: int | None, signal: int | None
) -> str | None:
    """Record what ``log`` says about the run's end; return the reason for its status (or None)."""
    from gpuledger.recorder.messages import epochs_ended

    peak = _rss_peak_b(session, exit_code, signal)
    diagnosis = failures.explain(log, status, exit_code, signal, peak, memory_limit_b())
    recorder = session.recorder
    for failure in diagnosis.failures:
        recorder.event(failure.kind, failure.message, **failure.event_payload(), source="log")
    reported = epochs_ended(session)
    if not reported:
        parsed = diagnosis.parsed  # explain read the whole output already
        if parsed.epochs:
            now = time.time()
            recorder.add_metrics(
                [Metric(t=now, key=k, value=v, epoch=e.epoch) for e in parsed.epochs for k, v in e.metrics.items()]
            )
            recorder.event(
                "log_parsed",
                f"{len(parsed.epochs)} epochs read from the {parsed.format} training output",
                format=parsed.format,
                epochs=len(parsed.epochs),
                total_epochs=parsed.total_epochs,
                final=parsed.final,
            )
    else:  # the epochs a training wrote but died before reporting (a crash saving its checkpoints)
        try:
            take_unreported(session, reported)
        except Exception:  # the run's end must be written whatever this finds
            debug_traceback()
    try:
        complete_evaluation(session, log)
    except Exception:  # the run's end must be written whatever this finds
        debug_traceback()
    try:
        record_lineage(session)  # a training's parent and model line: lineage.py
    except Exception:
        debug_traceback()
    return diagnosis.reason
