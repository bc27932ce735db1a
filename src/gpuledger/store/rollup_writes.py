"""Writing ``gpu_rollups`` (migration 2): the per run, GPU model and day sums cost reports read.

Derived data: a run's rows are replaced as a whole, in one transaction, so a report sees either
the old rows or the new ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.usage import DayUsage, weakest_rule
from gpuledger.store.schema import gpu_rollups

__all__ = ["replace_rollups", "rollup_rows"]

_CHUNK = 2000


def rollup_rows(days: Iterable[DayUsage]) -> list[dict[str, Any]]:
    """Day rows of single GPUs summed per run, day, GPU name and MIG profile (the table's key)."""
    out: dict[tuple[str, int, str, str], dict[str, Any]] = {}
    devices: dict[tuple[str, int, str, str], set[str]] = {}
    for d in days:
        key = (d.run_id, d.day, d.gpu_name or "", d.mig_profile or "")
        row = out.get(key)
        if row is None:
            out[key] = row = {
                "run_id": d.run_id,
                "day": d.day,
                "gpu_name": key[2],
                "mig_profile": key[3],
                "gpus": 0,
                "t0": d.t0,
                "t1": d.t1,
                "alloc_s": 0.0,
                "busy_s": None,
                "energy_j": None,
                "intervals": 0,
                "share_rule": None,
            }
            devices[key] = set()
        devices[key].add(d.device_uuid)
        row["gpus"] = len(devices[key])
        row["t0"], row["t1"] = min(row["t0"], d.t0), max(row["t1"], d.t1)
        row["alloc_s"] += d.alloc_s
        for col in ("busy_s", "energy_j"):
            value = getattr(d, col)
            if value is not None:
                row[col] = (row[col] or 0.0) + value
        row["intervals"] += d.intervals
        if d.share_rule:
            row["share_rule"] = weakest_rule({d.share_rule, *([row["share_rule"]] if row["share_rule"] else [])})
    return list(out.values())


def replace_rollups(conn: Connection, run_ids: Sequence[str], days: Iterable[DayUsage]) -> int:
    """Delete the rollup rows of ``run_ids`` and insert those of ``days`` (which belong to them)."""
    for i in range(0, len(run_ids), _CHUNK):
        conn.execute(sa.delete(gpu_rollups).where(gpu_rollups.c.run_id.in_(run_ids[i : i + _CHUNK])))
    rows = rollup_rows(days)
    for i in range(0, len(rows), _CHUNK):
        conn.execute(sa.insert(gpu_rollups), rows[i : i + _CHUNK])
    return len(rows)
