"""Materialising ``gpu_rollups`` for finished runs, so cost reports read a few rows per run and day
instead of every interval. Rows are the same day rows the reports compute on the fly
(reports/cost_usage.py), so a report's figures do not change when rollups appear.

A run is rolled up only when it is finished and no run it shares a GPU with is still running
(its share could still change). Rollups are not updated by later writes to a run's intervals
(an outbox replayed long after the run): ``rebuild=True`` rewrites them all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuledger.reports.cost_usage import _run_rows, interval_day_usage
from gpuledger.store import cost_queries as cq
from gpuledger.store.rollup_writes import replace_rollups

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from gpuledger.store import Ledger

__all__ = ["materialise_rollups"]


def _unsettled(conn: Connection, ids: list[str]) -> set[str]:
    """Runs of ``ids`` that share a GPU with a run still running."""
    tenants = cq.tenants_of(conn, ids, None, None)
    running_uuids = {t["uuid"] for t in tenants if t["status"] == "running"}
    return {t["run_id"] for t in tenants if t["uuid"] in running_uuids and t["status"] != "running"}


def materialise_rollups(ledger: Ledger, *, rebuild: bool = False, batch: int = 500) -> dict[str, int]:
    """Write the rollup rows of finished runs that lack them (all with ``rebuild``). Returns
    counts: runs rolled up, rows written, runs skipped (a co-tenant is still running)."""
    candidates = ledger.read(lambda conn: cq.rollup_candidates(conn, rebuild=rebuild))
    done = rows_written = skipped = 0
    for i in range(0, len(candidates), batch):
        todo = candidates[i : i + batch]

        def one_batch(conn: Connection, todo: list[str] = todo) -> tuple[int, int, int]:
            hold = _unsettled(conn, todo)
            rows = list(_run_rows(cq.run_rows(conn, scope=None, ids=[t for t in todo if t not in hold]), {}).values())
            days, _ = interval_day_usage(conn, rows, None, None)
            ids = [r.id for r in rows]
            return len(ids), replace_rollups(conn, ids, days), len(hold)

        n, written, held = ledger.write(one_batch)
        done += n
        rows_written += written
        skipped += held
    return {"runs": done, "rows": rows_written, "skipped": skipped}
