"""The cost rollups in the audit trail: a digest of each run's ``gpu_rollups`` rows whenever they are
written, and the runs whose rows were dropped, so ``verify`` can tell rows gpuledger wrote from rows
edited with SQL (a busy-seconds figure multiplied, a run flagged rolled up without its rows).

Only ledgers with an audit trail are audited (a team ledger; a local ledger has none). One audit
row per write covers every run of it: ``rollups.written`` ``{"runs": {run id: digest}}`` and
``rollups.dropped`` ``{"runs": [run ids]}``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store import schema

WRITTEN = "rollups.written"
DROPPED = "rollups.dropped"
# The columns a digest covers, in this order; floats and ints normalised so that the rows in memory
# and the rows read back from either database give the same text.
COLUMNS = ("day", "gpu_name", "mig_profile", "gpus", "t0", "t1", "alloc_s", "busy_s", "energy_j", "intervals",
           "share_rule", "team", "project", "user", "instance_type")  # fmt: skip
_FLOATS = frozenset({"t0", "t1", "alloc_s", "busy_s", "energy_j"})
_INTS = frozenset({"day", "gpus", "intervals"})


def _value(col: str, v: Any) -> Any:
    if v is None:
        return None
    if col in _FLOATS:
        f = float(v)
        return None if math.isnan(f) else f  # a NaN measurement is stored as NULL
    if col in _INTS:
        return int(v)
    return str(v)


def _line(r: Mapping[str, Any]) -> str:
    values = tuple(_value(c, r.get(c)) for c in COLUMNS)
    # ``measured`` (migration 10) is whether busy_s is not NULL in every row gpuledger writes: it
    # enters the digest only when it says otherwise, so digests recorded before it still verify.
    measured = r.get("measured")
    if measured is not None and bool(measured) != (values[COLUMNS.index("busy_s")] is not None):
        values += (bool(measured),)
    return repr(values)


def digest(rows: Iterable[Mapping[str, Any]]) -> str:
    """One run's rollup rows, any order: a short hash of their values."""
    lines = sorted(_line(r) for r in rows)
    return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()[:32]


def audited(conn: Connection) -> bool:
    """Whether this ledger keeps an audit trail (a team ledger)."""
    return conn.execute(sa.select(schema.audit_log.c.seq).limit(1)).first() is not None


def record_written(
    conn: Connection, run_ids: Collection[str], rows: Iterable[Mapping[str, Any]], *, actor: str = "gpuledger rollup"
) -> None:
    """After ``rows`` replaced the rollups of ``run_ids`` (a run may have none: no GPU use)."""
    if not run_ids or not audited(conn):
        return
    from gpuledger.store import audit

    by_run: dict[str, list[Mapping[str, Any]]] = {r: [] for r in run_ids}
    for row in rows:
        by_run[str(row["run_id"])].append(row)
    payload = {"runs": {run_id: digest(rs) for run_id, rs in sorted(by_run.items())}}
    audit.append(conn, actor=actor, action=WRITTEN, obj="gpu_rollups", payload=payload)


def record_dropped(conn: Connection, run_ids: Collection[str], *, actor: str = "gpuledger") -> None:
    """After the rollups of ``run_ids`` were dropped as stale."""
    if not run_ids or not audited(conn):
        return
    from gpuledger.store import audit

    audit.append(conn, actor=actor, action=DROPPED, obj="gpu_rollups", payload={"runs": sorted(run_ids)})


def stored_digests(conn: Connection) -> tuple[dict[str, str], dict[str, bool]]:
    """(run id -> digest of its rollup rows now, run id -> runs.rolled_up), for ``verify``."""
    r = schema.gpu_rollups.c
    q = sa.select(r.run_id, r.measured, *(r[c] for c in COLUMNS)).order_by(r.run_id)
    digests: dict[str, str] = {}
    current: str | None = None
    rows: list[Mapping[str, Any]] = []
    for row in conn.execute(q.execution_options(yield_per=5000)).mappings():
        if row["run_id"] != current:
            if current is not None:
                digests[current] = digest(rows)
            current, rows = row["run_id"], []
        rows.append(row)
    if current is not None:
        digests[current] = digest(rows)
    runs = schema.runs.c
    flags = {str(i): bool(f) for i, f in conn.execute(sa.select(runs.id, runs.rolled_up))}
    return digests, flags
