"""Read query for exports that carry every label of each run (the FOCUS export's Tags). Read-only.

Takes run ids a scoped report query already returned, so it needs no scope of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store.schema import run_labels

__all__ = ["labels_of"]

_CHUNK = 2000  # ids per IN (...) list: far below SQLite's and PostgreSQL's parameter limits


def labels_of(conn: Connection, ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """run id -> {label key: value}, for the runs ``ids`` that have labels."""
    lab = run_labels.c
    out: dict[str, dict[str, str]] = {}
    ordered = sorted(set(ids))
    for i in range(0, len(ordered), _CHUNK):
        chunk = ordered[i : i + _CHUNK]
        q = sa.select(lab.run_id, lab.key, lab.value).where(lab.run_id.in_(chunk))
        for run_id, key, value in conn.execute(q):
            out.setdefault(run_id, {})[key] = value
    return out
