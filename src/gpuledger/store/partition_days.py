"""PostgreSQL: the day partitions a write's rows need, made before the rows go in.

``gpu_intervals``, ``host_intervals`` and ``gpu_capacity`` are partitioned by UTC day with a
default partition (store/partitions.py), and the days are made ahead (yesterday to two days on).
A row for any other day (a replay of older data, an agent's outbox sent days late) would land in
the default partition, and the hourly pass would move it out with ``DELETE ... INSERT`` (dead rows,
the rows written twice). So every insert path into those tables calls ``require`` with the start
of each row first, inside its write transaction:

* the common case costs a set lookup: the rows' days against the days this process knows have a
  partition (per ``Database``; the batch's earliest and latest day when the days between are known);
* a day not known re-reads the catalog (another process may have made it) in that transaction;
* a day still missing rolls the write back (``PrepareFirst``: ``Database.write`` runs the rest),
  the missing days are made in a short transaction of their own (``partitions.ensure_days``: the
  maintainers' advisory lock and lock order, so two writers or replicas racing for the same day
  both succeed, the second finding it made), and the write runs again, into the new days. A GPU
  interval's day is made for the host intervals too (and the other way round): a run's two
  series lie on the same days, so a late push is rolled back once, not twice.

If a day cannot be made (its DDL timed out behind a long transaction), the write goes on into the
default partition as before, and the hourly pass moves it. What this process knows is re-read
every ``TTL_S``: retention may drop a day meanwhile (a row for it then goes to the default
partition until the re-read, as before).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store import partitions
from gpuledger.store.engine import Database
from gpuledger.store.errors import LedgerLocked, PrepareFirst

TTL_S = 600.0  # what a process knows of the catalog is re-read at least this often
_FAST_SPAN = 8  # batches spanning at most this many days are checked by their first and last day only
_log = logging.getLogger("gpuledger.store")


@dataclass(frozen=True)
class _Known:
    partitioned: bool
    days: frozenset[int]  # with a partition, or that could not be made (their rows go to the default)
    read_at: float  # time.monotonic() of the catalog read


class _Catalog:
    """What one ``Database``'s process knows of its tables' day partitions."""

    def __init__(self) -> None:
        self.tables: dict[str, _Known] = {}
        self.lock = threading.Lock()

    def settle(self, table: str, days: Iterable[int], partitioned: bool = True) -> None:
        with self.lock:
            old = self.tables.get(table)
            merged = frozenset(days) | (old.days if old is not None else frozenset())
            self.tables[table] = _Known(partitioned, merged, time.monotonic())


_catalogs: weakref.WeakKeyDictionary[Database, _Catalog] = weakref.WeakKeyDictionary()
_catalogs_lock = threading.Lock()


def _catalog(db: Database) -> _Catalog:
    with _catalogs_lock:
        found = _catalogs.get(db)
        if found is None:
            found = _catalogs[db] = _Catalog()
        return found


def forget(db: Database) -> None:
    """Drop what this process knows of ``db``'s partitions (after a migration or a drop of days)."""
    with _catalogs_lock:
        _catalogs.pop(db, None)


def days_of(table: str, starts: Iterable[float]) -> set[int]:
    """The UTC days (since 1970-01-01) of rows starting at ``starts`` (the table's units)."""
    per_day = partitions.DAY_S * partitions.SPECS[table].per_s
    return {math.floor(t / per_day) for t in starts}


def _unknown(table: str, starts: list[float], known: frozenset[int]) -> set[int]:
    """The days of ``starts`` not in ``known``; the first and last day only when they bound a
    short span all known (a recording run's batch: one day, two across a midnight)."""
    per_day = partitions.DAY_S * partitions.SPECS[table].per_s
    lo, hi = math.floor(min(starts) / per_day), math.floor(max(starts) / per_day)
    if hi - lo < _FAST_SPAN and all(d in known for d in range(lo, hi + 1)):
        return set()
    return days_of(table, starts) - known


def require(db: Database, conn: Connection, starts: Mapping[str, Iterable[float]]) -> None:
    """Raise PrepareFirst (from inside ``db.write``) when rows starting at ``starts`` (table ->
    starts in its units, store/partitions.SPECS) lie on a day whose partition does not exist yet;
    nothing on SQLite or for a table not partitioned (a ledger before migration 18 / 21)."""
    if db.dialect != "postgresql":
        return
    catalog = _catalog(db)
    missing: dict[str, set[int]] = {}
    for table, values in starts.items():
        rows = list(values)
        if not rows:
            continue
        known = catalog.tables.get(table)
        fresh = known is not None and time.monotonic() - known.read_at < TTL_S
        if fresh and known is not None and (not known.partitioned or not _unknown(table, rows, known.days)):
            continue
        known = _read(conn, catalog, table)  # not known, or known a while ago: the catalog, once
        if known.partitioned:
            lacking = _unknown(table, rows, known.days)
            if lacking:
                missing[table] = lacking
    if missing:
        what = ", ".join(f"{t} {sorted(d)}" for t, d in missing.items())
        raise PrepareFirst(lambda: make(db, missing), f"day partitions to make first: {what}")


def _read(conn: Connection, catalog: _Catalog, table: str) -> _Known:
    partitioned = partitions.is_partitioned(conn, table)
    days = frozenset(partitions.day_partitions(conn, table)) if partitioned else frozenset()
    with catalog.lock:  # a fresh read replaces the days: one retention dropped is known gone
        known = catalog.tables[table] = _Known(partitioned, days, time.monotonic())
    return known


def make(db: Database, missing: Mapping[str, Iterable[int]]) -> None:
    """Make the day partitions of ``missing`` (table -> days) in a transaction of their own, a
    GPU or host interval day in both interval tables; what this process knows, updated. A day that
    cannot be made now is logged and its rows go to the default partition (moved hourly)."""
    wanted: dict[str, set[int]] = {}
    for table, days in missing.items():
        for t in partitions.KEYS if table in partitions.KEYS else (table,):
            wanted.setdefault(t, set()).update(days)
    catalog = _catalog(db)
    try:
        made = db.write(lambda conn: partitions.ensure_days(conn, wanted))
    except (sa.exc.OperationalError, LedgerLocked) as exc:  # a lock timeout, deadlocks past the retries
        _log.warning("day partitions %s not made (rows for them go to the default partition): %s", wanted, exc)
    else:
        if made.created:
            _log.info("day partitions made for late rows: %s", ", ".join(made.created))
    for table, days in wanted.items():  # made now, by another writer, or given up: the write goes on
        catalog.settle(table, days)
