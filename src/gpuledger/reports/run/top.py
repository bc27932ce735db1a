"""``gpuledger top``: what the runs recording on this machine are doing now.

A run is shown when it is ``running``, was recorded on this host and its recorder process is
alive (runs/liveness.py), or when the node agent of this host discovered it and has not ended
it yet (``discovered`` without an end). Figures are those of each GPU's latest recorded interval (the
recorder flushes at least every 10 s); the epoch and ETA come from the epoch events: remaining
epochs times the median epoch so far.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from gpuledger.core.model import DISCOVERED, run_is_open
from gpuledger.core.training.epochs import EPOCH, spans

if TYPE_CHECKING:
    from gpuledger.store import Ledger

SCAN = 200  # running runs examined


def snapshot(ledger: Ledger, now: float, host: str | None = None) -> list[dict[str, Any]]:
    """One dict per live run on ``host`` (default: this machine), newest first."""
    from gpuledger.runs.host import host_name
    from gpuledger.runs.liveness import recorder_alive
    from gpuledger.store.series_queries import latest

    host = host or host_name()
    out = []
    found = ledger.list_runs(status="running", limit=SCAN) + ledger.list_runs(status=DISCOVERED, limit=SCAN)
    found.sort(key=lambda r: (r.started_at, r.id), reverse=True)
    for run in found:
        if run.host != host or not run_is_open(run.status, run.ended_at):
            continue
        if run.status == "running" and recorder_alive(run) is not True:
            continue
        recent = latest(ledger, run.id, last=1)
        devices = {d.uuid: d for d in ledger.devices(run.id)}
        gpus = []
        for uuid, ivs in sorted(recent["gpu"].items(), key=lambda kv: getattr(devices.get(kv[0]), "index", 99)):
            iv = ivs[-1]
            dev = devices.get(uuid)
            span = iv.t1 - iv.t0
            gpus.append(
                {
                    "index": dev.index if dev else None,
                    "name": dev.name if dev else uuid,
                    "util": None if iv.busy_s is None or span <= 0 else min(1.0, iv.busy_s / span),
                    "mem_used_b": iv.mem_used_max_b,
                    "proc_mem_b": iv.proc_mem_max_b,
                    "mem_total_b": dev.memory_total_b if dev else None,
                    "power_w": iv.power_max_w,
                    "temp_c": iv.temp_max_c,
                    "age_s": max(0.0, now - iv.t1),
                }
            )
        host_iv = recent["host"][-1] if recent["host"] else None
        epoch, total, eta = _progress(ledger, run, now)
        out.append(
            {
                "id": run.id,
                "name": run.name,
                "user": run.user,
                "project": run.labels.get("project"),
                "started_at": run.started_at,
                "elapsed_s": now - run.started_at,
                "epoch": epoch,
                "epochs": total,
                "eta_s": eta,
                "cpu_cores": None
                if host_iv is None or host_iv.t1 <= host_iv.t0
                else host_iv.cpu_s / (host_iv.t1 - host_iv.t0),
                "rss_b": host_iv.rss_max_b if host_iv else None,
                "gpus": gpus,
                # nothing written yet (the first flush is due): not yet known whether it has GPUs
                "sampled": bool(gpus) or host_iv is not None,
                "replayed": run.replayed,
            }
        )
    return out


def _progress(ledger: Ledger, run: Any, now: float) -> tuple[int | None, int | None, float | None]:
    """(epochs done, planned epochs, seconds left) from the epoch events and run.meta["epochs"]."""
    events = [e for e in ledger.events(run.id) if e.kind in ("epoch_start", "epoch_end")]
    ends = [e for e in events if e.kind == "epoch_end"]
    done = max((int(e.payload["epoch"]) for e in ends if isinstance(e.payload.get("epoch"), int)), default=None)
    total = run.meta.get("epochs") if isinstance(run.meta.get("epochs"), int) else None
    if total is None and ends and isinstance(ends[-1].payload.get("epochs"), int):
        total = ends[-1].payload["epochs"]
    durations = [s.t1 - s.t0 for s in spans(events, run.started_at, now) if s.phase == EPOCH and s.t1 > s.t0]
    finished = durations[: len(ends)]  # the last span may be the epoch in progress
    if done is None or total is None or not finished:
        return done, total, None
    per_epoch = statistics.median(finished)
    started_last = max((e.t for e in events if e.kind == "epoch_start"), default=None)
    in_progress = (now - started_last) if started_last is not None and started_last >= ends[-1].t else 0.0
    return done, total, max(0.0, (total - done) * per_epoch - in_progress)
