"""A command that could not start is still a run: failed, with the shell's exit code (127 not found,
126 cannot be run), the cause as its status reason and an empty log, so ``gpuledger runs``,
``show`` and ``query failures`` see the attempt that a typo or a missing install cost."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gpuledger.core.model import RunRecord
from gpuledger.recorder.launch import LaunchError
from gpuledger.recorder.session import run_summary, stderr_line

if TYPE_CHECKING:
    from gpuledger.recorder.wrap import WrapOptions

NO_METERING = "the command never started: nothing was metered"


def record_failed_launch(run: RunRecord, opts: WrapOptions, error: LaunchError) -> dict | None:
    """Write the failed run (or spool it when the ledger cannot take it); its summary, or None."""
    run.gpu_note = NO_METERING
    ended = max(time.time(), run.started_at)
    end = {"status": "failed", "ended_at": ended, "exit_code": error.exit_code, "status_reason": error.reason}
    pusher = opts.hooks.start_push(run.id, stderr_line) if opts.hooks.start_push is not None else None
    try:
        return _write(opts.db_url, run, end, summarize=opts.summary)
    except Exception as exc:
        stderr_line(f"gpuledger: could not write the failed run {run.id} to the ledger: {exc}")
        _spool(run, end, opts.db_url)
        return None
    finally:
        if pusher is not None:
            pusher.wake()
            pusher.finish(stderr_line)


def _write(db_url: str | None, run: RunRecord, end: dict, *, summarize: bool = True) -> dict:
    """The summary, or {} when nobody shows it (-q: reading it back would load the database layer)."""
    from gpuledger.store.run_writer import open_run_ledger

    ledger = open_run_ledger(db_url)  # a local ledger: the standard sqlite3 module (store/run_writer.py)
    try:
        ledger.create_run(run)  # as a recorded run: created running, then ended (rollups, outbox)
        ledger.set_log(run.id, b"")
        ledger.update_run(run.id, **end)
        return run_summary(ledger, run.id, now=end["ended_at"]) if summarize else {}
    finally:
        ledger.close()


def _spool(run: RunRecord, end: dict, db_url: str | None) -> None:
    from gpuledger.recorder.spool import write_spool

    for key, value in end.items():
        setattr(run, key, value)
    try:
        path = write_spool(run, [], [], [], [], [], ledger_url=db_url)
    except OSError as exc:
        stderr_line(f"gpuledger: could not keep the run locally either ({exc}); its record is lost")
        return
    stderr_line(f"gpuledger: the run is kept in {path}; write it to the ledger later with: gpuledger recover")
