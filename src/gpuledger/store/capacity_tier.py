"""Tiering the capacity ledger's raw intervals (docs/SCALE.md, issue 38): where a series store is
configured, ``retention run`` copies each host's raw ``gpu_capacity`` intervals into it, reads
them back and checks them, before it deletes them from the ledger (store/capacity_retention.py),
in the same transaction; the per GPU, day and host sums (``gpu_capacity_days``) every capacity
report reads stay in the ledger.

Per host and UTC day of the intervals' start: one ``write_capacity`` whose token names the rows
(series/capacity.token, so rows kept back by an earlier run and tiered later are a new batch),
then a read of the store by key and a comparison with the ledger's rows as the store keeps them
(series/capacity.quantize): per GPU the row count, the first and last start, the sums of the
states and energy and a sha256 over the rows in start order. That summary is the
``capacity.raw_tiered`` entry of the trail, which ``audit verify --series`` (store/series_verify.py)
re-checks. Rows a server's live ingest already wrote are held by their (GPU, start) and not stored
twice. A host whose rows the store does not hold exactly keeps them (TierError).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.capacity.model import DAY_MS
from gpuledger.series import capacity
from gpuledger.series.base import SeriesStore
from gpuledger.series.quantum import to_units
from gpuledger.store import audit
from gpuledger.store.schema import gpu_capacity
from gpuledger.store.series_tier import Tier, TierError, digest, why_differs

ACTION = "capacity.raw_tiered"
SUMS = (*capacity.STATES, "energy_mj")


def day_of(day: int) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(day * 86400))


def summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per GPU of quantized rows (sorted by GPU and start): rows, [first, last start], integer
    sums (energy in mJ, with how many rows measured it) and sha256."""
    by_gpu: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_gpu.setdefault(str(r["gpu_uuid"]), []).append(r)
    out: dict[str, Any] = {}
    for gpu, mine in sorted(by_gpu.items()):
        sums = {s: sum(int(r[s]) for r in mine) for s in capacity.STATES}
        energy = [to_units(r["energy_j"], capacity.ENERGY_SCALE) for r in mine]
        sums["energy_mj"] = sum(e for e in energy if e is not None)
        out[gpu] = {
            "rows": len(mine), "t0": [int(mine[0]["t0_ms"]), int(mine[-1]["t0_ms"])], "sums": sums,
            "energy_measured": sum(e is not None for e in energy), "sha256": digest(mine, capacity.COLUMNS),
        }  # fmt: skip
    return out


def stored_summary(store: SeriesStore, host: str, expected: Mapping[str, Any]) -> dict[str, Any]:
    """What ``store`` holds now of the rows ``expected`` (a summary) describes: per GPU, its rows
    of ``host`` from its first to its last start."""
    gpus = expected["gpus"]
    if not gpus:
        return {}
    lo = min(s["t0"][0] for s in gpus.values())
    hi = max(s["t0"][1] for s in gpus.values())
    rows = [
        r
        for r in store.capacity_intervals(sorted(gpus), lo, hi + 1)
        if r["host"] == host and gpus[r["gpu_uuid"]]["t0"][0] <= r["t0_ms"] <= gpus[r["gpu_uuid"]]["t0"][1]
    ]
    return summary(rows)


def differences(host: str, expected: Mapping[str, Any], found: Mapping[str, Any]) -> list[str]:
    """One line per GPU whose capacity rows in the store differ from those tiered."""
    out = []
    for gpu, want in expected["gpus"].items():
        got = found.get(gpu)
        if got == want:
            continue
        why = why_differs(want, got)
        lo, hi = want["t0"]
        out.append(f"capacity of GPU {gpu} on host {host} from {lo} to {hi} ms: {why}")
    return out


def tier_rows(conn: Connection, tier: Tier, host: str, where: sa.ColumnElement[bool], *, actor: str) -> int:
    """Copy ``host``'s ``gpu_capacity`` rows matching ``where`` into the store, one batch per UTC day,
    check each and record it (``capacity.raw_tiered``); TierError when the store does not hold
    exactly them. The rows copied (not already held)."""
    c = gpu_capacity.c
    days = sorted(int(d) for d in conn.scalars(sa.select(c.t0_ms // DAY_MS).where(where).distinct()))
    written = 0
    for day in days:  # a day in memory at a time (a backlog of months is many of them)
        in_day = sa.and_(where, c.t0_ms >= day * DAY_MS, c.t0_ms < (day + 1) * DAY_MS)
        found = conn.execute(sa.select(gpu_capacity).where(in_day).order_by(c.gpu_uuid, c.t0_ms)).mappings()
        rows = [{k: r[k] for k in capacity.COLUMNS} for r in found]
        expected = {"host": host, "day": day_of(day), "gpus": summary([capacity.quantize(r) for r in rows])}
        n = tier.store.write_capacity(rows, token=f"tier:{capacity.token(rows)}")
        problems = differences(host, expected, stored_summary(tier.store, host, expected))
        if problems:
            raise TierError("; ".join(problems))
        audit.append(
            conn, actor=actor, action=ACTION, obj=f"host:{host}", payload={"series": tier.url, "written": n, **expected}
        )
        written += n
    return written
