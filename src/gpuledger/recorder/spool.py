"""When the ledger cannot be written at the end of a run, keep the run in a local spool file.

The spool holds everything the recorder still had in memory (the run record, its devices and all
pending intervals, events and metrics) and the ledger it was meant for, as JSON in
``<data dir>/spool/<run id>.json``. ``gpuledger recover`` writes spooled runs into that ledger once
it is reachable again; appends are idempotent, so a run that was partly written before is
completed, not duplicated.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, Metric, RunRecord
from gpuledger.paths import data_dir

FORMAT = "gpuledger-spool/1"


def spool_dir(env: Mapping[str, str] | None = None) -> Path:
    return data_dir(env) / "spool"


def write_spool(
    run: RunRecord,
    devices: list[GpuIdentity],
    gpu: list[GpuInterval],
    host: list[HostInterval],
    events: list[Event],
    metrics: list[Metric],
    env: Mapping[str, str] | None = None,
    ledger_url: str | None = None,
    keep_log: bool = False,
) -> Path:
    """Keep the run in the spool. ``ledger_url``: the ledger the run was recorded for (None: the
    default one, resolved now, since ``GPULEDGER_DB`` may differ when ``recover`` runs).
    ``keep_log``: a process CMD started still writes the log file; ``recover`` archives it and
    leaves it in place."""
    from gpuledger.store.url import default_url, normalise_url

    folder = spool_dir(env)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    doc = {
        "format": FORMAT,
        # The spool folder is private (0700): a password in the URL stays with its owner.
        "ledger": normalise_url(ledger_url) if ledger_url else default_url(env),
        "run": dataclasses.asdict(run),
        "devices": [dataclasses.asdict(d) for d in devices],
        "gpu_intervals": [dataclasses.asdict(i) for i in gpu],
        "host_intervals": [dataclasses.asdict(i) for i in host],
        "events": [dataclasses.asdict(e) for e in events],
        "metrics": [dataclasses.asdict(m) for m in metrics],
        "keep_log": keep_log,
    }
    path = folder / f"{run.id}.json"
    tmp = path.with_suffix(".tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as fh:
        json.dump(doc, fh, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)  # a crash mid-write never leaves half a spool file
    return path


def _build(cls: type, data: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable spool file ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a gpuledger spool file (expected format {FORMAT!r})")
    return doc


def read_target(path: Path) -> str | None:
    """The ledger URL the spooled run was recorded for (None in spool files from before it was kept)."""
    target = _read(path).get("ledger")
    return target if isinstance(target, str) and target else None


def recover(path: Path, ledger) -> str:
    """Write one spooled run into ``ledger`` and delete the spool file; returns the run id."""
    doc = _read(path)
    run = _build(RunRecord, doc["run"])
    ledger.create_run(run)
    ledger.update_run(
        run.id,
        status=run.status,
        ended_at=run.ended_at,
        exit_code=run.exit_code,
        signal=run.signal,
        status_reason=run.status_reason,
        labels=run.labels,
        meta=run.meta,
    )
    ledger.add_devices(run.id, [_build(GpuIdentity, d) for d in doc["devices"]])
    ledger.append(
        run.id,
        [_build(GpuInterval, i) for i in doc["gpu_intervals"]],
        [_build(HostInterval, i) for i in doc["host_intervals"]],
        [_build(Event, e) for e in doc["events"]],
        [_build(Metric, m) for m in doc["metrics"]],
    )
    if run.log_path:
        from gpuledger.runs.logfile import archive_once, cap_or_default

        # Stored capped; the file is removed unless a process CMD started was still writing it.
        archive_once(ledger, run.id, run.log_path, cap_or_default(os.environ), remove=not doc.get("keep_log"))
    path.unlink()
    return run.id
