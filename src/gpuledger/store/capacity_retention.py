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
- on PostgreSQL, where ``gpu_capacity`` is partitioned by day (migration 21), whole days are
  dropped instead, under the same rules (store/capacity_days_drop.py): no DELETE, no bloat;
- each host's rows go in a transaction of their own (bounded work, the index on host and start);
- where a series store is configured (``tier``), each host's rows are first copied into it and
  checked, in that transaction (store/capacity_tier.py); a host whose rows the store does not
  hold exactly keeps them, named in ``Pruned.untiered``.

``store/capacity.rebuild_days`` recomputes day sums from the intervals; after a cut it is told to
start at the cut's day (the earlier days no longer have their intervals).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.capacity.model import DAY_MS
from gpuledger.store import capacity_tier
from gpuledger.store.schema import capacity_pushes, gpu_capacity
from gpuledger.store.series_tier import Tier, TierError

if TYPE_CHECKING:
    from gpuledger.store.ledger import Ledger

__all__ = ["Pruned", "cut_of", "prune_capacity", "tier_window_ms", "unpushed_guard"]


@dataclass(frozen=True)
class Pruned:
    cut_ms: int  # the UTC midnight the intervals ended by
    rows: int  # intervals deleted
    kept_unpushed: int  # intervals before the cut kept because a server has not acknowledged them
    hosts: int  # hosts whose intervals were looked at
    tiered: int = 0  # intervals copied into the series store before they were deleted (not held there yet)
    untiered: dict[str, str] = field(default_factory=dict)  # host -> why its rows were kept (the store)
    # PostgreSQL (store/capacity_days_drop.py): the days dropped as partitions, and those kept and why
    days_dropped: list[str] = field(default_factory=list)
    days_kept: dict[str, str] = field(default_factory=dict)


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


def tier_window_ms(tier: Tier | None, now: float) -> int:
    """The first instant of the days ``tier``'s store keeps (store/series_window.py); 0 without one."""
    return 0 if tier is None else (int(now // 86400) - tier.series_days + 1) * DAY_MS


def _before(host: str, cut_ms: int) -> sa.ColumnElement[bool]:
    c = gpu_capacity.c
    return sa.and_(c.host == host, c.t0_ms < cut_ms, c.t1_ms <= cut_ms)


def hosts_before(conn: Connection, cut_ms: int) -> list[str]:
    c = gpu_capacity.c
    return list(conn.scalars(sa.select(c.host).where(c.t0_ms < cut_ms).distinct().order_by(c.host)))


def prune_host(
    conn: Connection,
    host: str,
    cut_ms: int,
    tier: Tier | None = None,
    *,
    actor: str = "gpuledger retention",
    window_ms: int = 0,
) -> tuple[int, int, int]:
    """Delete ``host``'s intervals that ended by ``cut_ms`` and are acknowledged, copied into
    ``tier``'s store first where given, those starting from ``window_ms`` on (earlier ones are past
    the store's own window: it would drop them at once); (deleted, kept, copied)."""
    doomed = sa.and_(_before(host, cut_ms), ~unpushed_guard())
    copied = 0
    if tier is not None:
        copied = capacity_tier.tier_rows(
            conn, tier, host, sa.and_(doomed, gpu_capacity.c.t0_ms >= window_ms), actor=actor
        )
    deleted = conn.execute(sa.delete(gpu_capacity).where(doomed)).rowcount or 0
    kept = conn.scalar(sa.select(sa.func.count()).select_from(gpu_capacity).where(_before(host, cut_ms))) or 0
    return int(deleted), int(kept), copied


def prune_capacity(
    ledger: Ledger,
    before_ms: int,
    tier: Tier | None = None,
    *,
    actor: str = "gpuledger retention",
    now: float | None = None,
) -> Pruned:
    """Delete the raw capacity intervals that ended by the UTC midnight at or before ``before_ms``,
    one host per transaction, each copied into ``tier``'s series store first where given (those of
    the days the store keeps: ``tier.series_days`` back from ``now``, as store/series_window.py)."""
    cut = cut_of(before_ms)
    now = time.time() if now is None else now
    window_ms = tier_window_ms(tier, now)
    rows = kept = copied = 0
    untiered: dict[str, str] = {}
    hosts = ledger.read(lambda conn: hosts_before(conn, cut))
    for host in hosts:
        try:
            deleted, held, n = ledger.write(
                lambda conn, h=host: prune_host(conn, h, cut, tier, actor=actor, window_ms=window_ms)
            )
        except TierError as exc:  # rolled back: the host keeps its rows, the next run tries again
            untiered[host] = str(exc)
            continue
        rows, kept, copied = rows + deleted, kept + held, copied + n
    return Pruned(cut, rows, kept, len(hosts), copied, untiered)
