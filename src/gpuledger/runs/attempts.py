"""Attempts of one logical run (a YOLO training resumed after a crash): find, chain, total.

A resumed run points at the attempt before it through ``attempt_of``. ``attempt_chain`` walks the
links both ways from any attempt and adds up what all attempts used.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from gpuledger.core.ids import short_id
from gpuledger.core.model import RunRecord
from gpuledger.core.units import fmt_count, fmt_duration, fmt_hours, fmt_kwh, fmt_seconds

if TYPE_CHECKING:
    from gpuledger.store import Ledger

SCAN_LIMIT = 5000  # runs examined when looking for an earlier attempt (newest first)


def _same_dir(a: object, b: str) -> bool:
    return isinstance(a, str) and os.path.normpath(a) == os.path.normpath(b)


def find_earlier_attempt(ledger: Ledger, save_dir: str, before: RunRecord) -> RunRecord | None:
    """The newest run, started before ``before``, whose ``meta.save_dir`` is ``save_dir``."""
    for run in ledger.list_runs(limit=SCAN_LIMIT):
        if run.id == before.id or run.started_at > before.started_at:
            continue
        if _same_dir(run.meta.get("save_dir"), save_dir):
            return run
    return None


def _later_attempts(ledger: Ledger, run: RunRecord) -> list[RunRecord]:
    later = [r for r in ledger.list_runs(since=run.started_at) if r.attempt_of == run.id and r.id != run.id]
    return sorted(later, key=lambda r: r.started_at)


def chain_runs(ledger: Ledger, run_id: str) -> list[RunRecord]:
    """Every attempt of the logical run ``run_id`` belongs to, first attempt first."""
    run = ledger.get_run(run_id)
    chain, seen = [run], {run.id}
    while chain[0].attempt_of and chain[0].attempt_of not in seen:
        try:
            earlier = ledger.get_run(chain[0].attempt_of)
        except Exception:  # the earlier attempt was deleted: the chain starts here
            break
        seen.add(earlier.id)
        chain.insert(0, earlier)
    while True:
        later = [r for r in _later_attempts(ledger, chain[-1]) if r.id not in seen]
        if not later:
            return chain
        seen.add(later[0].id)
        chain.append(later[0])


def _sum(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def attempt_chain(ledger: Ledger, run_id: str, now: float | None = None) -> dict[str, Any]:
    """The attempts (id, status, times, epochs, usage) and the totals across them.

    ``position`` is the index of ``run_id`` in ``attempts``. Usage sums come from the ledger's
    interval totals; ``epochs`` counts distinct epoch numbers with metrics over all attempts.
    """
    from gpuledger.store.tiered_totals import gpu_sums, host_sums  # tiered days included

    now = time.time() if now is None else now
    runs = chain_runs(ledger, run_id)
    attempts, all_epochs = [], set()
    for run in runs:
        gpu = gpu_sums(ledger, run.id)
        host = host_sums(ledger, run.id)
        epochs = sorted({m.epoch for m in ledger.metrics(run.id) if m.epoch is not None})
        all_epochs.update(epochs)
        end = run.ended_at if run.ended_at is not None else now
        attempts.append(
            {
                "id": run.id,
                "status": run.status,
                "status_reason": run.status_reason,
                "started_at": run.started_at,
                "ended_at": run.ended_at,
                "wall_seconds": max(0.0, end - run.started_at),
                "first_epoch": epochs[0] if epochs else None,
                "last_epoch": epochs[-1] if epochs else None,
                "gpu_busy_seconds": _sum([t.get("busy_s") for t in gpu.values()]),
                "gpu_energy_joules": _sum([t.get("energy_j") for t in gpu.values()]),
                "cpu_seconds": host.get("cpu_s"),
            }
        )
    keys = ("wall_seconds", "gpu_busy_seconds", "gpu_energy_joules", "cpu_seconds")
    totals = {k: _sum([a[k] for a in attempts]) for k in keys}
    totals["attempts"] = len(attempts)
    totals["epochs"] = len(all_epochs)
    position = next(i for i, r in enumerate(runs) if r.id == run_id)
    return {"attempts": attempts, "position": position, "totals": totals}


def format_chain(chain: dict[str, Any]) -> str:
    """Two lines for ``gpuledger show``: the attempts, then the totals across them."""
    parts = []
    for i, a in enumerate(chain["attempts"]):
        epochs = ""
        if a["first_epoch"] is not None and a["first_epoch"] == a["last_epoch"]:
            epochs = f", epoch {a['first_epoch']}"
        elif a["first_epoch"] is not None:
            epochs = f", epochs {a['first_epoch']}-{a['last_epoch']}"
        here = " (this run)" if i == chain["position"] else ""
        parts.append(f"{short_id(a['id'])} {a['status']}{epochs}{here}")
    t = chain["totals"]
    figures = [f"wall {fmt_duration(t['wall_seconds'] or 0)}"]
    if t["gpu_busy_seconds"] is not None:
        figures.append(f"busy {fmt_hours(t['gpu_busy_seconds'] / 3600)} GPU-h")
    if t["gpu_energy_joules"] is not None:
        figures.append(f"energy {fmt_kwh(t['gpu_energy_joules'] / 3.6e6)}")
    if t["cpu_seconds"] is not None:
        figures.append(f"CPU {fmt_seconds(t['cpu_seconds'])}")
    figures.append(fmt_count(t["epochs"], "epoch"))
    return f"Attempts ({t['attempts']}): " + " -> ".join(parts) + "\nAcross attempts: " + ", ".join(figures)
