"""Materialising ``gpu_rollups`` for finished runs, so cost reports read a few rows per run and day
instead of every interval. Rows are the same day rows the reports compute on the fly
(reports/cost/usage.py), so a report's figures do not change when rollups appear.

A run is rolled up only when it is finished and no run still running held one of its GPUs while it
did (its share could still change). A run without a GPU is marked rolled up with no rows. Later
writes that change what a rollup summed (intervals replayed after the run ended, changed fields)
drop its rows and flag (store/rollup_stale.py); the next call writes them again.
``rebuild=True`` rewrites every finished run's rows.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from gpuledger.core.model import run_is_open
from gpuledger.core.pricing.usage import held_span
from gpuledger.reports.cost.usage import _run_rows, interval_day_usage
from gpuledger.store import cost_queries as cq
from gpuledger.store.rollup_writes import replace_rollups

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from gpuledger.store import Ledger

__all__ = ["materialise_rollups"]


def _unsettled(conn: Connection, ids: list[str]) -> set[str]:
    """Runs of ``ids`` chained by overlapping use of a GPU to a run still running on it (the share
    split works on such chains, core/pricing/share.py): their share is not final yet. Runs that ended
    before the chain began are settled."""
    tenants = cq.tenants_of(conn, ids, None, None)
    busy_uuids = {t["uuid"] for t in tenants if run_is_open(t["status"], t["ended_at"])}
    if not busy_uuids:
        return set()
    chained = [t for t in tenants if t["uuid"] in busy_uuids]
    ended = {t["run_id"] for t in chained if not run_is_open(t["status"], t["ended_at"])}
    last = cq.last_interval_ends(conn, sorted(ended))
    by_uuid: dict[str, list[tuple[float, float, str, bool]]] = {}
    for t in chained:
        running = run_is_open(t["status"], t["ended_at"])
        end = math.inf if running else held_span(t["status"], t["started_at"], t["ended_at"], last.get(t["run_id"]))[1]
        by_uuid.setdefault(t["uuid"], []).append((t["started_at"], end, t["run_id"], running))
    out: set[str] = set()
    for spans in by_uuid.values():
        spans.sort()
        chain: list[str] = []
        chain_end, live = -math.inf, False
        for start, end, run_id, running in spans:
            if start >= chain_end:  # a gap: the chain so far is settled unless a running run is in it
                if live:
                    out.update(chain)
                chain, live = [], False
            chain.append(run_id)
            chain_end, live = max(chain_end, end), live or running
        if live:
            out.update(chain)
    return out & set(ids)


def materialise_rollups(ledger: Ledger, *, rebuild: bool = False, batch: int = 500) -> dict[str, int]:
    """Write the rollup rows of finished runs that lack them (all with ``rebuild``). Returns
    counts: runs rolled up, rows written, runs skipped (a co-tenant is still running)."""
    candidates = ledger.read(lambda conn: cq.rollup_candidates(conn, rebuild=rebuild))
    done = rows_written = skipped = 0
    for i in range(0, len(candidates), batch):
        todo = candidates[i : i + batch]

        def one_batch(conn: Connection, todo: list[str] = todo) -> tuple[int, int, int]:
            hold = _unsettled(conn, todo)
            ready = [t for t in todo if t not in hold]
            instances = cq.label_values(conn, "instance_type", ids=ready)
            rows = list(_run_rows(cq.run_rows(conn, scope=None, replayed=True, ids=ready), instances).values())
            days, _ = interval_day_usage(conn, rows, None, None)
            grouping = {r.id: r._asdict() for r in rows}
            return len(rows), replace_rollups(conn, [r.id for r in rows], days, grouping), len(hold)

        n, written, held = ledger.write(one_batch)
        done += n
        rows_written += written
        skipped += held
    return {"runs": done, "rows": rows_written, "skipped": skipped}
