"""Reading runs back: resolve a reference, settle lost runs, summarise."""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timezone

from gpuledger.core.ids import short_id
from gpuledger.core.model import RunRecord, run_is_open
from gpuledger.runs import series_expired
from gpuledger.runs.liveness import reconcile


def load_run(ledger, ref: str) -> RunRecord:
    """The run named by a full id or unique prefix, with a dead recorder's run marked lost."""
    return reconcile(ledger, ledger.get_run(ledger.resolve(ref)))


def summary(ledger, run: RunRecord, now: float | None = None) -> dict:
    """The run's summary from totals the ledger sums itself (fast on runs of millions of rows).

    A run still recording is summed up to its latest written interval (``measured_until``), as
    ``gpuledger cost`` prices it: the recorder writes every few seconds, and time it has not
    written yet would otherwise count as idle GPU time. A run with raw days tiered into the
    ledger's series store (``Ledger.tiered``) is summed from its intervals read whole; a
    series-only run whose store dropped some of its days, from its day sums (runs/series_expired.py)."""
    from gpuledger.core.metering.summary import summarize

    now = time.time() if now is None else now
    if ledger.tiered(run.id) and (expired := series_expired.summary(ledger, run, ledger.devices(run.id), now)):
        return expired  # a series-only run whose store dropped some days: its day sums
    if ledger.tiered(run.id):  # raw days in the ledger's series store: the SQL rollups miss them
        gpu_ivs, host_ivs = ledger.gpu_intervals(run.id), ledger.host_intervals(run.id)
        counts = dict(Counter(g.device_uuid for g in gpu_ivs))
        gpu, hosts, host_count = gpu_ivs, host_ivs, len(host_ivs)
    else:
        gpu, counts = ledger.gpu_rollups(run.id)
        host, host_count = ledger.host_rollup(run.id)
        hosts = [host] if host is not None else []
    measured_until = None
    if run_is_open(run.status, run.ended_at):
        measured_until = ledger.last_flush_t(run.id)
    data = summarize(
        run,
        ledger.devices(run.id),
        gpu,
        hosts,
        now=measured_until if measured_until is not None else now,
        counts={**counts, "host": host_count},
    )
    if run_is_open(run.status, run.ended_at):
        data["measured_until"] = iso(measured_until)
        data["elapsed_seconds"] = max(0.0, now - run.started_at)
    return data


def run_row(run: RunRecord, gpus: int, busy_s: float | None, now: float) -> dict:
    """One light row per run: what ``gpuledger runs`` and the server's run list show."""
    end = run.ended_at if run.ended_at is not None else now
    return {
        "id": run.id,
        "short_id": short_id(run.id),
        "name": run.name,
        "status": run.status,
        "started_at": iso(run.started_at),
        "wall_seconds": max(0.0, end - run.started_at),
        "user": run.user,
        "host": run.host,
        "project": run.labels.get("project"),
        "team": run.labels.get("team"),
        "gpus": gpus,
        "busy_gpu_hours": None if busy_s is None else busy_s / 3600,
        "replayed": run.replayed,
        "command": run.command,
    }


def list_rows(ledger, runs: list[RunRecord], now: float | None = None) -> list[dict]:
    """Rows for ``gpuledger runs`` (no interval scan), with dead recorders' runs marked lost; a
    run's days tiered into the ledger's series store counted from the audit trail's sums, and a
    series-only run's GPUs and busy time from its day sums (read for the whole list at once)."""
    from gpuledger.store.tiered_totals import gpu_busy, series_only_gpu_sums

    now = time.time() if now is None else now
    ids = [run.id for run in runs]
    only = ledger.read(lambda conn: series_only_gpu_sums(conn, ids)) if ids else {}
    rows = []
    for run in runs:
        run = reconcile(ledger, run)
        per_gpu = gpu_busy(ledger, run.id, only.get(run.id, {}))
        busy = [b for b in per_gpu.values() if b is not None]
        rows.append(run_row(run, len(per_gpu), sum(busy) if busy else None, now))
    return rows


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_since(text: str, now: float | None = None) -> float:
    """``2026-11-01``, an ISO timestamp, or a relative ``3d`` / ``12h`` / ``30m``."""
    now = time.time() if now is None else now
    units = {"d": 86400, "h": 3600, "m": 60}
    if text and text[-1] in units and text[:-1].replace(".", "", 1).isdigit():
        return now - float(text[:-1]) * units[text[-1]]
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"--since {text!r}: use a date (2026-11-01), a timestamp, or 3d / 12h / 30m") from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()
