"""Runs whose recorder died (``kill -9``, power loss) are ``lost``: say so, and keep their log.

A run is written with the recorder's pid and host. When a reader on the same host finds the run
still ``running`` but that process gone (or replaced by a newer process with the same pid), the
run becomes ``lost``: usage stands as of the last flush, and the log the relay kept writing on
disk is archived into the ledger.
"""

from __future__ import annotations

import os

import psutil

from gpuledger.core.model import RunRecord
from gpuledger.runs.host import host_name

PID_START_SLACK_S = 60.0  # the recorder process starts a moment before it stamps started_at


def recorder_alive(run: RunRecord) -> bool | None:
    """True/False on the run's own host; None when the run was recorded elsewhere."""
    if run.host != host_name() or run.recorder_pid is None:
        return None
    try:
        proc = psutil.Process(run.recorder_pid)
        return proc.create_time() <= run.started_at + PID_START_SLACK_S and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def reconcile(ledger, run: RunRecord) -> RunRecord:
    """Mark a dead recorder's run as lost (once) and archive its on-disk log; return the fresh record.
    A run whose end waits in the spool is left as it is: ``gpuledger recover`` writes its real end."""
    if run.status != "running" or recorder_alive(run) is not False:
        return run
    from gpuledger.recorder.spool import is_waiting

    if is_waiting(run.id):
        return run
    last = ledger.last_flush_t(run.id)
    reason = "gpuledger stopped while the command ran (killed?); usage is recorded up to the last flush"
    fields: dict[str, object] = {"status": "lost", "status_reason": reason}
    if last is not None:
        fields["ended_at"] = last
    ledger.update_run(run.id, **fields)
    if run.log_path and os.path.isfile(run.log_path):
        from gpuledger.runs.logfile import archive, cap_or_default

        # The file stays: CMD may outlive its recorder and still be writing to it.
        archive(ledger, run.id, run.log_path, cap_or_default(os.environ), remove=False)
    return ledger.get_run(run.id)


def fresh_log(ledger, run: RunRecord) -> bytes | None:
    """The run's log: the file on disk when it is newer than the archived copy (a lost run's CMD
    may still be writing), else the ledger's copy."""
    stored = ledger.get_log(run.id)
    if run.log_path and run.status in ("running", "lost") and os.path.isfile(run.log_path):
        from gpuledger.core.training.logcap import find_cut
        from gpuledger.runs.logfile import cap_or_default, read_capped

        on_disk = read_capped(run.log_path, cap_or_default(os.environ))
        stored_b = None if stored is None else (cut.total_b if (cut := find_cut(stored)) else len(stored))
        if on_disk is not None and (stored_b is None or on_disk.total_b >= stored_b):
            return on_disk.data
    return stored
