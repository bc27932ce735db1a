"""A run's raw rows read a page at a time, for ``gpu migrate --layout compact``
(store/series_compact.py): from the ledger by keyset pages of its primary key ((run, device, seq)
and (run, seq)), from the series store by its ``gpu_page`` / ``host_page`` (series/base.py), so
the migration holds a few pages of a run, never the whole run (2 M rows of a 72-hour run of 8 GPUs
at 1 s intervals are some 2 GB as Python rows).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.series.base import SeriesStore
from gpuledger.store import schema, series_tier

FIRST = -(2**31)  # below every seq (an int4 in the ledger)
Row = dict[str, Any]

# The run's distinct GPUs by a walk of the key's index, one probe per GPU (no scan of its rows).
_DEVICES = sa.text(
    "WITH RECURSIVE d(u) AS (SELECT min(device_uuid) FROM gpu_intervals WHERE run_id = :r "
    "UNION ALL SELECT (SELECT min(device_uuid) FROM gpu_intervals WHERE run_id = :r AND device_uuid > d.u) "
    "FROM d WHERE d.u IS NOT NULL) SELECT u FROM d WHERE u IS NOT NULL"
)


def ledger_devices(conn: Connection, run_id: str) -> list[str]:
    """The GPUs the ledger holds rows of the run for, sorted."""
    return [str(u) for u in conn.scalars(_DEVICES, {"r": run_id})]


def ledger_counts(conn: Connection, run_id: str) -> tuple[int, int]:
    """The run's GPU and host rows in the ledger (counted, not read)."""
    g, h = schema.gpu_intervals.c, schema.host_intervals.c
    gpu = conn.scalar(sa.select(sa.func.count()).where(g.run_id == run_id)) or 0
    host = conn.scalar(sa.select(sa.func.count()).where(h.run_id == run_id)) or 0
    return int(gpu), int(host)


def _pages(fetch: Callable[[int], list[Row]], after: int, limit: int, upto: int | None = None) -> Iterator[list[Row]]:
    """Keyset pages: ``fetch(after)`` gives the rows with seq > ``after`` in seq order, ``limit``
    and those tied with the last (so a page never splits a seq); only those up to ``upto``."""
    while True:
        page = fetch(after)
        kept = page if upto is None else [r for r in page if int(r["seq"]) <= upto]
        if kept:
            yield kept
        if len(page) < limit or len(kept) < len(page):
            return
        after = int(page[-1]["seq"])


def ledger_gpu_pages(conn: Connection, run_id: str, device_uuid: str, limit: int) -> Iterator[list[Row]]:
    """The run's rows of one GPU in seq order, ``limit`` a page, without run_id."""
    g = schema.gpu_intervals
    q = sa.select(*(g.c[c] for c in series_tier.GPU_COLUMNS)).where(
        g.c.run_id == run_id, g.c.device_uuid == device_uuid
    )

    def fetch(after: int) -> list[Row]:
        page = q.where(g.c.seq > after).order_by(g.c.seq).fetch(limit, with_ties=True)
        return [dict(r) for r in conn.execute(page).mappings()]

    return _pages(fetch, FIRST, limit)


def ledger_host_pages(conn: Connection, run_id: str, limit: int) -> Iterator[list[Row]]:
    """The run's host rows in seq order, ``limit`` a page, without run_id."""
    h = schema.host_intervals
    q = sa.select(*(h.c[c] for c in series_tier.HOST_COLUMNS)).where(h.c.run_id == run_id)

    def fetch(after: int) -> list[Row]:
        page = q.where(h.c.seq > after).order_by(h.c.seq).fetch(limit, with_ties=True)
        return [dict(r) for r in conn.execute(page).mappings()]

    return _pages(fetch, FIRST, limit)


def store_gpu_pages(
    store: SeriesStore, run_id: str, device_uuid: str, limit: int, *, after: int = FIRST, upto: int | None = None
) -> Iterator[list[Row]]:
    """The store's rows of the run's GPU with seq > ``after`` (and <= ``upto``), in seq order, a
    page at a time (a page may pass ``limit`` by rows tied at its last seq)."""
    return _pages(lambda a: store.gpu_page(run_id, device_uuid, a, limit), after, limit, upto)


def store_host_pages(
    store: SeriesStore, run_id: str, limit: int, *, after: int = FIRST, upto: int | None = None
) -> Iterator[list[Row]]:
    """The store's host rows of the run, as ``store_gpu_pages``."""
    return _pages(lambda a: store.host_page(run_id, a, limit), after, limit, upto)
