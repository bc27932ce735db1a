"""The tier store's window pass reads only the series-only runs and days of the window it considers.

On the real PostgreSQL server: a ledger with many series-only runs from weeks ago and a few in the
day the pass drops; every statement's rows read back are counted (the ``after_cursor_execute``
hook): the pass after the first reads the window's runs and days only, and the days it records are
those of the old code's full read, narrowed to the window.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import test_series_tier as tiers
from gpuledger.store import Ledger, audit, codec, schema, series_day_sums, series_tier, series_window
from server_support import NOW
from test_store_records import minimal_run, run_id

pytestmark = pytest.mark.postgres

pg_url = tiers.pg_url
TODAY = math.floor(NOW / 86400)
OLD_RUNS = 300  # series-only runs of five to six weeks ago, three days each
SERIES_DAYS = 5


@pytest.fixture
def series_url(tmp_path: Path) -> Iterator[str]:
    yield from tiers.store_url("postgres", tmp_path, "window_t")


@pytest.fixture
def reads() -> Iterator[list[tuple[str, int]]]:
    """(statement, rows it returned) of every statement any engine sends while the test runs."""
    seen: list[tuple[str, int]] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append((statement, cursor.rowcount))

    sa.event.listen(sa.engine.Engine, "after_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(sa.engine.Engine, "after_cursor_execute", record)


def _series_only_run(conn: sa.Connection, n: int, first_day: int, days: int, store: str) -> None:
    """A series-only run (as serve --series-only leaves one in the ledger): its row, its mark, one
    GPU segment and host segment over ``days`` days from ``first_day`` 01:00, a day sum per day."""
    rid = run_id(n)
    t0, t1 = first_day * 86400 + 3600.0, (first_day + days - 1) * 86400 + 7200.0
    conn.execute(sa.insert(schema.runs), codec.run_row(minimal_run(rid, started_at=t0)))
    conn.execute(sa.insert(schema.series_only_runs).values(run_id=rid, store=store, marked_at=t0))
    segments = [
        {"run_id": rid, "device_uuid": uuid, "first_seq": 0, "last_seq": 99, "t0": t0 - lead, "t1": t1}
        for uuid, lead in (("GPU-a", 0.0), ("", 60.0))  # the host stream starts a minute before the GPU's
    ]
    conn.execute(sa.insert(schema.series_segments), segments)
    sums = [
        {"run_id": rid, "device_uuid": "GPU-a", "day": d, "t0": t0, "t1": t1, "busy_s": 1.0, "busy_n": 1,
         "energy_j": 2.0, "energy_n": 1, "intervals": 1}
        for d in range(first_day, first_day + days)
    ]  # fmt: skip
    conn.execute(sa.insert(schema.series_day_sums), sums)


def _read_of(reads: list[tuple[str, int]], table: str) -> int:
    return sum(rows for sql, rows in reads if table in sql and sql.lstrip().upper().startswith("SELECT"))


def test_the_window_pass_reads_only_the_runs_and_days_of_its_window(
    pg_url: str, series_url: str, reads: list[tuple[str, int]]
) -> None:
    tier = series_tier.Tier.open(series_url, series_days=SERIES_DAYS)
    try:
        cut = TODAY - SERIES_DAYS + 1  # the first day the store keeps after the pass at NOW
        with Ledger(pg_url) as led:

            def populate(conn: sa.Connection) -> None:
                for n in range(OLD_RUNS):
                    _series_only_run(conn, n, TODAY - 42 + n % 7, 3, tier.url)
                _series_only_run(conn, OLD_RUNS, cut - 1, 1, tier.url)  # the day this pass drops
                _series_only_run(conn, OLD_RUNS + 1, cut - 2, 2, tier.url)  # the day before and that day
                _series_only_run(conn, OLD_RUNS + 2, TODAY - 1, 1, tier.url)  # inside the window: kept
                _series_only_run(conn, OLD_RUNS + 3, cut - 1, 1, "postgresql://elsewhere/series")  # another store

            led.write(populate)
            every = led.read(lambda c: series_day_sums.store_days(c, tier.url))  # the whole read, unbounded
            assert len(every) == 9 + 2 + 1 and series_day_sums.iso_day(cut - 1) in every
            first = series_window.keep_window(led, tier, actor="test", now=NOW - 86400)  # the pass of yesterday
            assert first.dropped == [d for d in every if d < series_day_sums.iso_day(cut - 1)]
            reads.clear()
            report = series_window.keep_window(led, tier, actor="test", now=NOW)
        assert report.dropped == [series_day_sums.iso_day(cut - 1)]  # the day past the window since yesterday's
        # what the pass read of the runs' day sums and segments: the two runs on that day, not the 300 old ones
        assert _read_of(reads, "series_day_sums") == 1  # that one day (DISTINCT)
        assert _read_of(reads, "series_segments") <= 2  # the first rows' starts of the runs reaching into it
    finally:
        tier.store.close()


def test_store_days_bounds_give_the_days_of_the_full_read_inside_them(pg_url: str) -> None:
    shown = "postgresql://series/store"
    with Ledger(pg_url) as led:

        def populate(conn: sa.Connection) -> None:
            for n, (first_day, days) in enumerate([(TODAY - 20, 3), (TODAY - 10, 1), (TODAY - 9, 4), (TODAY - 2, 2)]):
                _series_only_run(conn, n, first_day, days, shown)

        led.write(populate)
        every = led.read(lambda c: series_day_sums.store_days(c, shown))
        for since, before in [("", None), ("", "2000-01-01"), (every[2], every[7]), (every[3], None), ("", every[4])]:
            got = led.read(lambda c, a=since, b=before: series_day_sums.store_days(c, shown, a, b))
            assert got == [d for d in every if since <= d and (before is None or d < before)], (since, before)


def test_the_window_pass_reads_only_the_tier_entries_written_since_its_last_window(
    pg_url: str, series_url: str, reads: list[tuple[str, int]]
) -> None:
    """A fleet's trail holds a tier entry per run and day for all its history: the pass after the
    first reads those written since the last window's first day (ix_audit_log_action_t), not all."""
    tier = series_tier.Tier.open(series_url, series_days=SERIES_DAYS)
    try:
        cut = TODAY - SERIES_DAYS + 1
        with Ledger(pg_url) as led:

            def populate(conn: sa.Connection) -> None:
                for n in range(OLD_RUNS):  # tiered weeks ago, each a day after the day it holds
                    day = TODAY - 42 + n % 7
                    payload = {"day": series_day_sums.iso_day(day), "series": tier.url}
                    t = (day + 1) * 86400.0 + 60
                    audit.append(conn, actor="t", action=series_tier.ACTION, obj=f"run:{n}", payload=payload, t=t)
                recent = {"day": series_day_sums.iso_day(cut - 1), "series": tier.url}  # tiered yesterday
                audit.append(conn, actor="t", action=series_tier.ACTION, obj="run:x", payload=recent, t=NOW - 86400)

            led.write(populate)
            first = series_window.keep_window(led, tier, actor="test", now=NOW - 86400)
            assert len(first.dropped) == 7  # the old entries' days, read whole the first time
            reads.clear()
            report = series_window.keep_window(led, tier, actor="test", now=NOW)
        assert report.dropped == [series_day_sums.iso_day(cut - 1)]
        tier_reads = [rows for sql, rows in reads if "audit_log" in sql and "IN (" in sql.upper()]
        assert tier_reads == [1]  # the one entry since yesterday's window, not the 300 before it
    finally:
        tier.store.close()
