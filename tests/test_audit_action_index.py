"""Migration 22: the audit trail indexed by (action, t), and the tier window's read that uses it.

A ledger at version 21 (the index dropped, its version row removed) gains the index when opened;
on SQLite the plan of the window pass's read of tier entries searches that index rather than
scanning the whole trail. An entry written up to a day before the day it tiers (a clock set back)
is still read by the pass; one written before that, which no tiering can write, is not.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import test_series_tier as tiers
from gpuledger.store import Ledger, audit, schema, series_day_sums, series_tier, series_window
from gpuledger.store import migrations as mig
from gpuledger.store.engine import Database
from server_support import NOW

INDEX = "ix_audit_log_action_t"


def _back_to_version_21(url: str) -> None:
    db = Database(url)
    try:
        db.write(lambda c: c.execute(sa.text(f"DROP INDEX {INDEX}")))
        db.write(lambda c: c.execute(sa.delete(schema.schema_version).where(schema.schema_version.c.version == 22)))
    finally:
        db.close()


def _indexes(url: str) -> list[str]:
    db = Database(url)
    try:
        return db.read(lambda c: [ix["name"] for ix in sa.inspect(c).get_indexes("audit_log")])
    finally:
        db.close()


def test_migration_22_adds_the_action_index_to_a_version_21_ledger(ledger_url: str) -> None:
    Ledger(ledger_url).close()
    _back_to_version_21(ledger_url)
    assert INDEX not in _indexes(ledger_url)
    with Ledger(ledger_url) as led:
        assert led.schema_version() == mig.LATEST == 22
    assert INDEX in _indexes(ledger_url)


def test_the_tier_entries_since_a_day_are_an_index_search_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    Ledger(url).close()
    db = Database(url)
    try:
        a = schema.audit_log.c
        q = sa.select(a.payload).where(a.action.in_(("run.raw_tiered", "capacity.raw_tiered")), a.t >= 1.0)
        sql = str(q.compile(dialect=db.engine.dialect, compile_kwargs={"literal_binds": True}))
        plan = db.read(lambda c: " ".join(str(r[-1]) for r in c.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}")))
    finally:
        db.close()
    assert f"SEARCH audit_log USING INDEX {INDEX} (action=? AND t>?)" in plan


pg_url = tiers.pg_url


@pytest.fixture
def series_url(tmp_path: Path) -> Iterator[str]:
    yield from tiers.store_url("postgres", tmp_path, "window_a")


@pytest.mark.postgres
def test_an_entry_written_within_a_day_before_its_day_is_still_read(pg_url: str, series_url: str) -> None:
    """The pass reads entries from a day before the last window's first day: a day tiered by a
    ledger whose clock was set back (by less than a day) is still recorded as dropped."""
    today = math.floor(NOW / 86400)
    tier = series_tier.Tier.open(series_url, series_days=5)
    try:
        cut = today - 5 + 1  # the first day kept by the pass at NOW; yesterday's kept cut - 1
        with Ledger(pg_url) as led:

            def old(conn: sa.Connection) -> None:  # a day tiered weeks ago: the first pass records a window
                payload = {"day": series_day_sums.iso_day(today - 40), "series": tier.url}
                t = NOW - 39 * 86400
                audit.append(conn, actor="t", action=series_tier.ACTION, obj="run:old", payload=payload, t=t)

            led.write(old)
            first = series_window.keep_window(led, tier, actor="test", now=NOW - 86400)  # its window starts at cut - 1
            assert first.dropped == [series_day_sums.iso_day(today - 40)]

            def tiered(conn: sa.Connection) -> None:
                payload = {"day": series_day_sums.iso_day(cut - 1), "series": tier.url}
                # written 23 h before that day began: a clock set back
                t = (cut - 1) * 86400.0 - 23 * 3600
                audit.append(conn, actor="t", action=series_tier.ACTION, obj="run:late", payload=payload, t=t)

            led.write(tiered)
            report = series_window.keep_window(led, tier, actor="test", now=NOW)
        assert report.dropped == [series_day_sums.iso_day(cut - 1)]
    finally:
        tier.store.close()
