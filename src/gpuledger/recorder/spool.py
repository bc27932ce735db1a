"""When the ledger cannot be written at the end of a run, keep the run in a local spool file.

The spool holds everything the recorder still had in memory (the run record, its devices and all
pending intervals, events and metrics) and the ledger it was meant for, as JSON in
``<data dir>/spool/<run id>.json``. ``gpuledger recover`` writes spooled runs into that ledger once
it is reachable again; appends are idempotent, so a run that was partly written before is
completed, not duplicated.

A run recorded with ``--server`` also names the team servers it is pushed to (its pusher says so
with ``push_to``; the ledger may have been locked all along, so the outbox may not know the run).
``recover`` puts the run in the outbox of each of them and of every server it was pushed to before
(its end, its last rows and its log are new), so ``gpuledger sync`` pushes what the spool held.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, Metric, RunRecord
from gpuledger.paths import data_dir

FORMAT = "gpuledger-spool/1"

# run id -> the team servers its pusher pushes to (this process), written into its spool file
_push_targets: dict[str, list[str]] = {}
_push_targets_lock = threading.Lock()


def push_to(run_id: str, server: str) -> None:
    """The run is pushed to ``server``: should it be spooled, ``recover`` puts it in that outbox."""
    with _push_targets_lock:
        servers = _push_targets.setdefault(run_id, [])
        if server not in servers:
            servers.append(server)


def push_targets(run_id: str) -> list[str]:
    with _push_targets_lock:
        return list(_push_targets.get(run_id, []))


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
    servers: Iterable[str] | None = None,
) -> Path:
    """Keep the run in the spool. ``ledger_url``: the ledger the run was recorded for (None: the
    default one, resolved now, since ``GPULEDGER_DB`` may differ when ``recover`` runs).
    ``keep_log``: a process CMD started still writes the log file; ``recover`` archives it and
    leaves it in place. ``servers``: the team servers the run is pushed to (default: those
    ``push_to`` named for it)."""
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
        "servers": list(push_targets(run.id) if servers is None else servers),
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


@dataclass(frozen=True)
class Spooled:
    path: Path
    run_id: str
    servers: list[str]


def is_waiting(run_id: str, env: Mapping[str, str] | None = None) -> bool:
    """The run's real end waits in this user's spool for ``gpuledger recover`` (one stat)."""
    return (spool_dir(env) / f"{run_id}.json").is_file()


def waiting(env: Mapping[str, str] | None = None, *, servers: bool = False) -> dict[str, Spooled]:
    """Run id -> its spool file, for the runs waiting for ``gpuledger recover``. ``servers``: also
    read which servers each names (reads every file; otherwise only their names are listed)."""
    found: dict[str, Spooled] = {}
    for path in sorted(spool_dir(env).glob("*.json")):
        named: list[str] = []
        if servers:
            try:
                listed = _read(path).get("servers")
            except ValueError:
                listed = None
            named = [s for s in listed if isinstance(s, str)] if isinstance(listed, list) else []
        found[path.stem] = Spooled(path, path.stem, named)
    return found


@dataclass(frozen=True)
class Recovered:
    run_id: str
    servers: list[str]  # the outboxes the run was put (back) in: gpuledger sync pushes it


def recover(path: Path, ledger) -> Recovered:
    """Write one spooled run into ``ledger``, put it in the outbox of every server it is pushed
    to, and delete the spool file."""
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
    servers = _back_in_outbox(ledger, run.id, doc.get("servers") or [])
    path.unlink()  # last: a failure above leaves the file, and recover again redoes it all harmlessly
    return Recovered(run.id, servers)


def _back_in_outbox(ledger, run_id: str, named: list[Any]) -> list[str]:
    """Register the run for the servers its spool file names, and make every server that already
    had it push it again: its end, the rows the spool held and its log are new to them. A server
    that sealed the run ``lost`` meanwhile (``gpuledger sync`` ran first) takes its owner's real end.
    The watermarks stay: every row below them is on that server already."""
    from gpuledger.store import pushes

    states = [s for s in pushes.all_states(ledger) if s.run_id == run_id]
    for state in states:
        if state.done or state.run_sig is not None or state.last_error:
            # run_sig None: the record and devices go again; done/last_error: it is pending again
            pushes.save(ledger, dataclasses.replace(state, run_sig=None, done=False, last_error=None))
    known = {s.server for s in states}
    new = [s for s in dict.fromkeys(x for x in named if isinstance(x, str) and x) if s not in known]
    for server in new:
        pushes.register(ledger, server, [run_id])
    return sorted(known | set(new))
