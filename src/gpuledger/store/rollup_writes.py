"""Writing ``gpu_rollups`` (migration 2): the per run, GPU model and day sums cost reports read.

Derived data: a run's rows are replaced as a whole, in one transaction, and the run is marked
``rolled_up`` in the same transaction, so a report sees either the old state or the new one. On a
team ledger the same transaction appends their digests to the audit trail (store/rollup_audit.py);
``rolled_up`` is not part of a run's seal, so writing rollups never breaks one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.pricing.usage import DayUsage, weakest_rule
from gpuledger.store import rollup_audit
from gpuledger.store.schema import gpu_rollups, runs

__all__ = ["GROUPING_COLUMNS", "replace_rollups", "rollup_rows"]

GROUPING_COLUMNS = ("team", "project", "user", "instance_type")  # copied from the run onto each row

_CHUNK = 2000


def rollup_rows(days: Iterable[DayUsage]) -> list[dict[str, Any]]:
    """Day rows of single GPUs summed per run, day, GPU name, MIG profile and whether they measured
    busy time (the table's key): the held hours of a GPU without busy time are billed by rule on the
    busy basis, so they must not vanish into a measured GPU's busy sum."""
    out: dict[tuple[str, int, str, str, bool], dict[str, Any]] = {}
    devices: dict[tuple[str, int, str, str, bool], set[str]] = {}
    for d in days:
        key = (d.run_id, d.day, d.gpu_name or "", d.mig_profile or "", d.busy_s is not None)
        row = out.get(key)
        if row is None:
            out[key] = row = {
                "run_id": d.run_id,
                "day": d.day,
                "gpu_name": key[2],
                "mig_profile": key[3],
                "measured": key[4],
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


def replace_rollups(
    conn: Connection,
    run_ids: Sequence[str],
    days: Iterable[DayUsage],
    grouping: Mapping[str, Mapping[str, Any]],
) -> int:
    """Delete the rollup rows of ``run_ids``, insert those of ``days`` (which belong to them) with
    each run's GROUPING_COLUMNS values from ``grouping``, and mark the runs rolled up (a run
    without rows too: it used no GPU)."""
    for i in range(0, len(run_ids), _CHUNK):
        chunk = run_ids[i : i + _CHUNK]
        conn.execute(sa.delete(gpu_rollups).where(gpu_rollups.c.run_id.in_(chunk)))
        conn.execute(sa.update(runs).where(runs.c.id.in_(chunk)).values(rolled_up=True))
    rows = rollup_rows(days)
    for row in rows:
        values = grouping.get(row["run_id"], {})
        row.update({col: values.get(col) for col in GROUPING_COLUMNS})
    for i in range(0, len(rows), _CHUNK):
        conn.execute(sa.insert(gpu_rollups), rows[i : i + _CHUNK])
    rollup_audit.record_written(conn, run_ids, rows)  # a team ledger's trail holds their digests
    return len(rows)
