"""PostgreSQL capacity retention by day: whole ``gpu_capacity`` day partitions dropped, never rows
deleted (store/partitions.py partitions it by UTC day of ``t0_ms`` since migration 21).

A day partition that ends by the cut (a UTC midnight, store/capacity_retention.cut_of) goes in one
transaction of its own, after a check under a SHARE lock (no push lands in it meanwhile) that:

- a team server has acknowledged every interval in it, where the ledger pushes capacity (as the
  DELETE keeps such rows, store/capacity_retention.unpushed_guard; those ending by the cut are
  counted in ``Pruned.kept_unpushed`` as the DELETE counts them);
- every interval in it ends by the cut (one running past the cut's midnight keeps its day until a
  later cut passes it: the ledger refuses only replays that end by the cut, store/capacity.py).
  So where the DELETE would take a day's rows but the one that crosses the cut, the day waits;
- the day sums every capacity report reads (``gpu_capacity_days``, written in the transaction that
  inserts the intervals) hold at least as many intervals per GPU and host as the partition;
- with a series store (``tier``), each host's rows of the day were copied into it, read back and
  checked (store/capacity_tier.py, one ``capacity.raw_tiered`` entry per host); one host the store
  does not hold exactly keeps the whole day.

The trail gets ``capacity.raw_dropped`` (the day, its rows per host, the cut) in the transaction of
the ``DROP TABLE``. The day sums are not touched, so their seals (store/capacity_audit.py) and
``gpuledger audit verify`` hold afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.capacity.model import DAY_MS
from gpuledger.store import audit, capacity_tier, partitions
from gpuledger.store.capacity_retention import Pruned, cut_of, tier_window_ms, unpushed_guard
from gpuledger.store.schema import capacity_pushes, gpu_capacity, gpu_capacity_days
from gpuledger.store.series_tier import Tier, TierError

if TYPE_CHECKING:
    from gpuledger.store.ledger import Ledger

ACTION = "capacity.raw_dropped"
OBJECT = "capacity"
_LOCK_TIMEOUT = "10s"


class _Kept(Exception):
    """The day must stay (rolled back); the message says why."""

    def __init__(self, why: str, unpushed: int = 0) -> None:
        super().__init__(why)
        self.unpushed = unpushed


class _Untiered(Exception):
    """The series store did not hold one host's rows of the day exactly (rolled back)."""

    def __init__(self, host: str, why: str) -> None:
        super().__init__(f"host {host}: {why}")
        self.host, self.why = host, why


def partitioned(ledger: Ledger) -> bool:
    return ledger.dialect == "postgresql" and ledger.read(lambda c: partitions.is_partitioned(c, partitions.CAPACITY))


def _in_day(day: int) -> sa.ColumnElement[bool]:
    c = gpu_capacity.c
    return sa.and_(c.t0_ms >= day * DAY_MS, c.t0_ms < (day + 1) * DAY_MS)  # partition pruning: this day only


def _check(conn: Connection, day: int, name: str, cut_ms: int) -> dict[str, int]:
    """Rows per host of the locked partition, or _Kept when one of the rules keeps the day."""
    per_host = {
        str(host): (int(n), int(last))
        for host, n, last in conn.exec_driver_sql(f"SELECT host, count(*), max(t1_ms) FROM {name} GROUP BY host")
    }
    if per_host and conn.execute(sa.select(capacity_pushes.c.server).limit(1)).first() is not None:
        q = (
            sa.select(sa.func.count())
            .select_from(gpu_capacity)
            .where(_in_day(day), gpu_capacity.c.t1_ms <= cut_ms, unpushed_guard())
        )
        unpushed = int(conn.scalar(q) or 0)
        if unpushed:
            raise _Kept(f"{unpushed} intervals not acknowledged by a team server yet", unpushed)
    late = sorted(h for h, (_, last) in per_host.items() if last > cut_ms)
    if late:
        raise _Kept(f"intervals of host {late[0]} run past the cut; the day goes once a later cut passes them")
    # An interval counts in the day sums of the day it ends in (core/capacity/model.split_days): per
    # GPU, host and that day, the sums must count at least the partition's intervals.
    d = gpu_capacity_days.c
    last_day = f"floor((t1_ms - 1) / {DAY_MS})::int"
    counts = (
        sa.text(f"SELECT gpu_uuid, host, {last_day} AS day, count(*) AS n FROM {name} GROUP BY 1, 2, 3")
        .columns(gpu_uuid=sa.String, host=sa.Text, day=sa.Integer, n=sa.Integer)
        .subquery("p")
    )
    p = counts.c
    held = sa.and_(d.gpu_uuid == p.gpu_uuid, d.host == p.host, d.day == p.day)
    short = (
        sa.select(p.gpu_uuid, p.host)
        .select_from(counts.outerjoin(gpu_capacity_days, held))
        .where(sa.or_(d.intervals.is_(None), d.intervals < p.n))
        .limit(1)
    )
    missing = conn.execute(short).first()
    if missing is not None:
        raise _Kept(
            f"the day sums (gpu_capacity_days) of GPU {missing.gpu_uuid} on host {missing.host} miss intervals "
            "of the day: rebuild them (store/capacity.rebuild_days) before its intervals go"
        )
    return {h: n for h, (n, _) in per_host.items()}


def _drop_day(
    conn: Connection, day: int, name: str, cut_ms: int, tier: Tier | None, window_ms: int, actor: str
) -> tuple[dict[str, int], int]:
    """Drop the day's partition when the rules allow, copying it into ``tier`` first where the
    store keeps the day: (rows per host dropped, rows copied). _Kept or _Untiered otherwise."""
    conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT}'")
    conn.exec_driver_sql(f"LOCK TABLE {name} IN SHARE MODE")  # no interval of the day arrives meanwhile
    per_host = _check(conn, day, name, cut_ms)
    copied = 0
    if tier is not None and (day + 1) * DAY_MS > window_ms:  # older days are past the store's own window
        for host in sorted(per_host):
            where = sa.and_(gpu_capacity.c.host == host, _in_day(day), gpu_capacity.c.t0_ms >= window_ms)
            try:
                copied += capacity_tier.tier_rows(conn, tier, host, where, actor=actor)
            except TierError as exc:
                raise _Untiered(host, str(exc)) from exc
    conn.exec_driver_sql(f"DROP TABLE {name}")
    if per_host:
        date = capacity_tier.day_of(day)
        payload = {"day": date, "rows": sum(per_host.values()), "hosts": per_host, "cut_ms": cut_ms}
        audit.append(conn, actor=actor, action=ACTION, obj=OBJECT, payload=payload)
    return per_host, copied


def _lock_timeout(exc: sa.exc.OperationalError) -> bool:
    return getattr(exc.orig, "sqlstate", None) == "55P03"  # lock_not_available: lock_timeout ran out


def old_days(ledger: Ledger, cut_ms: int) -> dict[int, str]:
    """Day -> partition of the capacity days that end by ``cut_ms``."""
    found = ledger.read(lambda c: partitions.day_partitions(c, partitions.CAPACITY))
    return {day: name for day, name in found.items() if (day + 1) * DAY_MS <= cut_ms}


def drop_days(ledger: Ledger, before_ms: int, tier: Tier | None = None, *, actor: str, now: float) -> Pruned:
    """Drop the capacity day partitions that end by the UTC midnight at or before ``before_ms`` and
    may go, one transaction per day; each copied into ``tier`` first where given (the days the
    store keeps, as store/capacity_retention.prune_capacity)."""
    cut_ms, window_ms = cut_of(before_ms), tier_window_ms(tier, now)
    try:
        partitions.maintain(ledger.database)  # strays out of the default partition, into their days
    except sa.exc.OperationalError as exc:
        if not _lock_timeout(exc):
            raise  # else: strays stay in the default partition until the next maintenance
    rows = copied = unpushed = 0
    hosts: set[str] = set()
    dropped: list[str] = []
    kept: dict[str, str] = {}
    untiered: dict[str, str] = {}
    for day, name in sorted(old_days(ledger, cut_ms).items()):
        date = capacity_tier.day_of(day)
        drop: Callable[[Connection], tuple[dict[str, int], int]] = lambda c, d=day, n=name: _drop_day(  # noqa: E731
            c, d, n, cut_ms, tier, window_ms, actor
        )
        try:
            per_host, n = ledger.write(drop)
        except _Kept as why:  # rolled back: the day stays whole
            kept[date] = str(why)
            unpushed += why.unpushed
            continue
        except _Untiered as exc:
            kept[date] = f"not tiered into {tier.url if tier else 'the series store'}: {exc}"
            untiered[exc.host] = f"{date}: {exc.why}"
            continue
        except sa.exc.OperationalError as exc:
            if not _lock_timeout(exc):
                raise
            kept[date] = f"its partition stayed locked by other transactions for {_LOCK_TIMEOUT}; tried again next time"
            continue
        dropped.append(date)
        rows, copied, hosts = rows + sum(per_host.values()), copied + n, hosts | set(per_host)
    return Pruned(cut_ms, rows, unpushed, len(hosts), copied, untiered, dropped, kept)
