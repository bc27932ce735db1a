"""Busy GPU seconds of a run some of whose raw days were tiered into a series store and dropped
(store/series_tier.py), without reading the store: the ``run.raw_tiered`` entries' per-GPU sums
(checked against the store when they were tiered, and by ``audit verify --series``) of the seq
ranges the ledger no longer holds (``rollup_marks`` at the dropped level), added to the sums of
the rows it still holds. For ``gpuledger runs`` and a report's earlier runs, which read many runs
and need one figure per GPU, not the rows.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store import schema
from gpuledger.store.partitions import DROPPED_LEVEL
from gpuledger.store.series_tier import ACTION, GPU_SUMS

if TYPE_CHECKING:
    from gpuledger.store import Ledger

_BUSY_NAME, _BUSY_SCALE = GPU_SUMS["busy_s"]


def gpu_busy(ledger: Ledger, run_id: str) -> dict[str, float | None]:
    """Per device uuid, the run's busy seconds (None where no interval held measured it), as
    ``Ledger.gpu_totals`` sums them, with the tiered and dropped days added when the ledger reads a
    series store (``Ledger.tiered``), to the store's units."""
    out = {uuid: t.get("busy_s") for uuid, t in ledger.gpu_totals(run_id).items()}
    if not ledger.tiered(run_id):
        return out
    marks, payloads = ledger.read(lambda conn: _dropped(conn, run_id))
    seen: set[tuple[str, int, int]] = set()
    for payload in payloads:
        for uuid, part in payload.get("gpu", {}).items():
            lo, hi = part["seq"]
            # Still held by the ledger (tiered, not dropped), or the same day recorded twice.
            if uuid not in marks or hi > marks[uuid] or (uuid, lo, hi) in seen:
                continue
            seen.add((uuid, lo, hi))
            out[uuid] = (out.get(uuid) or 0.0) + part["sums"][_BUSY_NAME] / _BUSY_SCALE
    return dict(sorted(out.items()))


def _dropped(conn: Connection, run_id: str) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """The highest seq dropped per GPU, and the run's ``run.raw_tiered`` payloads."""
    m, a = schema.rollup_marks.c, schema.audit_log.c
    q = sa.select(m.device_uuid, m.upto_seq).where(m.run_id == run_id, m.series == "gpu", m.level_s == DROPPED_LEVEL)
    marks = {str(uuid): int(upto) for uuid, upto in conn.execute(q)}
    tq = sa.select(a.payload).where(a.object == f"run:{run_id}", a.action == ACTION).order_by(a.seq)
    return marks, [json.loads(p) for p in conn.scalars(tq)]
