"""The GPU intervals ``cost RUN`` prices a run from when its raw days were tiered into the
ledger's series store and dropped (store/series_tier.py, docs/SCALE.md "Tiering"): read whole
through the ledger's merged reads (store/series_read.py), so the run keeps one line per GPU, as
before the drop, where its frozen rollups give one per GPU model. A run of which the store has
since dropped a tiered day past its own window (store/series_window.py) no longer reads back
whole: it is priced from its rollups, which still hold every day; so is a run that shared a GPU
with another run at the time (reports/cost/usage.collect_runs: the split needs both runs' rows).
A series-only run whose store dropped some of its days is priced from its day sums
(store/series_day_sums.py), which keep every day, per GPU."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpuledger.store import tiered_totals

if TYPE_CHECKING:
    from gpuledger.store import Ledger


def tiered_intervals(ledger: Ledger, run_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Run id -> its GPU intervals (run_id, device_uuid, t0, t1, busy_s, energy_j), for each run
    of ``run_ids`` with tiered days the ledger reads whole; none (and no query) without a store."""
    out: dict[str, list[dict[str, Any]]] = {}
    for run_id in run_ids:
        if not ledger.tiered(run_id) or tiered_totals.expired(ledger, run_id):
            continue
        if ledger.series_expired_days(run_id):  # a series-only run: priced from its day sums, which keep every day
            continue
        out[run_id] = [
            {"run_id": run_id, "device_uuid": g.device_uuid, "t0": g.t0, "t1": g.t1, "busy_s": g.busy_s,
             "energy_j": g.energy_j}
            for g in ledger.gpu_intervals(run_id)
        ]  # fmt: skip
    return out
