"""Retention of the capacity ledger: raw ``gpu_capacity`` intervals are deleted after a while, the
per-GPU, per-day sums (``gpu_capacity_days``, what every capacity report reads) are kept forever.

A node agent writes one row per GPU per interval (a 1,024-GPU fleet at 10 s: about 8.8 million
rows a day), and nothing reads them once their day sums exist except the outbox and a rebuild. So:

- the cut is a UTC midnight, and only intervals that end by it go, so every day before the cut
  keeps exactly the sums it had and no day after it loses a row;
- an interval a team server has not acknowledged yet stays: in a ledger that pushes capacity
  (``capacity_pushes`` has rows; a sync registers its server there before its first request, so a
  server that was never reached counts too), a row goes only when every server it pushes to has
  a watermark for that GPU past the row's start, so an agent's outbox never loses data to retention;
- each host's rows go in a transaction of their own (bounded work, the index on host and start).

``store/capacity.rebuild_days`` recomputes day sums from the intervals; after a cut it is told to
start at the cut's day (the earlier days no longer have their intervals).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.capacity.model import DAY_MS
from gpuledger.store.schema import capacity_pushes, gpu_capacity

if TYPE_CHECKING:
    from gpuledger.store.ledger import Ledger

__all__ = ["Pruned", "prune_capacity", "unpushed_guard"]


@dataclass(frozen=True)
class Pruned:
    cut_ms: int  # the UTC midnight the intervals ended by
    rows: int  # intervals deleted
    kept_unpushed: int  # intervals before the cut kept because a server has not acknowledged them
    hosts: int  # hosts whose intervals were looked at


def cut_of(before_ms: int) -> int:
    """The UTC midnight at or before ``before_ms``."""
    return before_ms // DAY_MS * DAY_MS


def unpushed_guard() -> sa.ColumnElement[bool]:
    """True for a ``gpu_capacity`` row some server this ledger pushes to has not acknowledged."""
    c, p = gpu_capacity.c, capacity_pushes.c
    servers = sa.select(p.server).distinct().subquery("servers")
    # correlate by hand: the row is two subqueries down, where SQLAlchemy would not look for it
    acknowledged = (
        sa.exists()
        .where(p.server == servers.c.server, p.gpu_uuid == c.gpu_uuid, p.next_t0_ms > c.t0_ms)
        .correlate(gpu_capacity, servers)
    )
    return sa.exists(sa.select(servers.c.server).where(~acknowledged).correlate(gpu_capacity))


def _before(host: str, cut_ms: int) -> sa.ColumnElement[bool]:
    c = gpu_capacity.c
    return sa.and_(c.host == host, c.t0_ms < cut_ms, c.t1_ms <= cut_ms)


def hosts_before(conn: Connection, cut_ms: int) -> list[str]:
    c = gpu_capacity.c
    return list(conn.scalars(sa.select(c.host).where(c.t0_ms < cut_ms).distinct().order_by(c.host)))


def prune_host(conn: Connection, host: str, cut_ms: int) -> tuple[int, int]:
    """Delete ``host``'s intervals that ended by ``cut_ms`` and are acknowledged; (deleted, kept)."""
    guard = unpushed_guard()
    deleted = conn.execute(sa.delete(gpu_capacity).where(_before(host, cut_ms), ~guard)).rowcount or 0
    kept = conn.scalar(sa.select(sa.func.count()).select_from(gpu_capacity).where(_before(host, cut_ms))) or 0
    return int(deleted), int(kept)


def prune_capacity(ledger: Ledger, before_ms: int) -> Pruned:
    """Delete the raw capacity intervals that ended by the UTC midnight at or before ``before_ms``,
    one host per transaction."""
    cut = cut_of(before_ms)
    rows = kept = 0
    hosts = ledger.read(lambda conn: hosts_before(conn, cut))
    for host in hosts:
        deleted, held = ledger.write(lambda conn, h=host: prune_host(conn, h, cut))
        rows, kept = rows + deleted, kept + held
    return Pruned(cut, rows, kept, len(hosts))
