"""Runs' seals computed from their rows now, many runs per query (core/audit/seal.py does the digest).

``verify`` recomputes the seal of every sealed run: one query per table for a chunk of runs,
instead of eight per run, so a ledger of a hundred thousand runs is read in a few thousand queries.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.audit import seal as seals
from gpuledger.store import log_codec
from gpuledger.store import schema as T

CHUNK = 200  # runs per query
Found = tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]  # (seal now, rows per series name)


def _by_run(conn: Connection, table: sa.Table, ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    names = [c.name for c in table.c if c.name != "run_id"]
    q = sa.select(table.c.run_id, *(table.c[n] for n in names)).where(table.c.run_id.in_(ids))
    for run_id, *values in conn.execute(q):
        out.setdefault(run_id, []).append(dict(zip(names, values, strict=True)))
    return out


def current_seals(conn: Connection, run_ids: Sequence[str], *, intervals: bool = True) -> Iterator[tuple[str, Found]]:
    """(run id, (seal now, rows per series)) for each of ``run_ids`` that exists, chunk by chunk;
    ``intervals=False``: without reading the interval rows (a seal with no series, for a caller
    that seals them a page at a time: store/series_compact_seal.py)."""
    tables = (T.run_labels, T.devices, *((T.gpu_intervals, T.host_intervals) if intervals else ()), T.events, T.metrics)
    for i in range(0, len(run_ids), CHUNK):
        ids = list(run_ids[i : i + CHUNK])
        runs = {r["id"]: dict(r) for r in conn.execute(sa.select(T.runs).where(T.runs.c.id.in_(ids))).mappings()}
        parts = {t.name: _by_run(conn, t, ids) for t in tables}
        lg = T.logs.c
        logs = {  # the log itself, whichever form it is stored in
            run_id: log_codec.digest(bytes(data), int(size_b))
            for run_id, data, size_b in conn.execute(sa.select(lg.run_id, lg.data, lg.size_b).where(lg.run_id.in_(ids)))
        }
        for run_id in ids:
            run = runs.get(run_id)
            if run is None:
                continue
            gpu = parts.get("gpu_intervals", {}).get(run_id, [])
            host = parts.get("host_intervals", {}).get(run_id, [])
            digest = seals.seal(
                run,
                parts["run_labels"].get(run_id, []),
                parts["devices"].get(run_id, []),
                gpu,
                host,
                parts["events"].get(run_id, []),
                parts["metrics"].get(run_id, []),
                logs.get(run_id),
            )
            by_series: dict[str, list[dict[str, Any]]] = {"host_intervals": host}
            for r in gpu:
                by_series.setdefault(f"gpu_intervals/{r['device_uuid']}", []).append(r)
            yield run_id, (digest, by_series)


def current_seal(conn: Connection, run_id: str, *, intervals: bool = True) -> Found | None:
    """The run's seal computed from its rows now, and the rows per series; None if no such run."""
    for _, found in current_seals(conn, [run_id], intervals=intervals):
        return found
    return None
