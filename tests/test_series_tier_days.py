"""The tier store's own window (store/series_window.py), on the real PostgreSQL server, into the
compact PostgreSQL store and into ClickHouse on chDB: ``retention run --series`` drops the store's
whole days older than ``--series-days`` and records them once, ``audit verify --series`` names
them as expired but still fails for a day deleted behind retention's back, and the compact
PostgreSQL store's day partitions are made ahead by retention and by the team server.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from gpuledger.cli.main import cli
from gpuledger.series import postgres_ddl, quantum
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, partitions, schema, series_tier, series_window
from gpuledger.store.retention import DAY_S, Policy, run_retention
from server_support import backend_url
from test_pg_partitions import OPEN_DAYS, TODAY, _exists
from test_series_tier import KINDS, PG, SKIP_CHDB, N, _date, _ingested, store_url

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    with backend_url("postgres", tmp_path) as url:
        yield url


def _drop_schema(name: str) -> None:
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '30s'")
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.fixture(params=KINDS)
def series_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from store_url(request.param, tmp_path, "tier_d")


@pytest.fixture
def pg_series_url() -> Iterator[str]:
    name = f"tier_m_{uuid.uuid4().hex[:12]}"
    yield f"{PG}?schema={name}"
    _drop_schema(name)


def _env(tmp_path: Path) -> dict[str, str]:
    home = str(tmp_path / "home")
    return {"GPULEDGER_RATES": "", "GPULEDGER_HOME": home, "GPULEDGER_CLOSE_AFTER_DAYS": str(OPEN_DAYS)}


def _retention(pg_url: str, series_url: str, tmp_path: Path, *more: str) -> Any:
    args = ["retention", "run", "--db", pg_url, "--drop-partitions", "--keep-logs", "--keep-capacity"]
    return CliRunner().invoke(cli, [*args, "--series", series_url, *more], env=_env(tmp_path))


def _verify(pg_url: str, series_url: str, tmp_path: Path) -> Any:
    args = ["audit", "verify", "--db", pg_url, "--series", series_url]
    return CliRunner().invoke(cli, args, env=_env(tmp_path))


def _entries(pg_url: str) -> list[dict[str, Any]]:
    """The payloads of the trail's ``series.days_dropped`` entries, oldest first."""
    a = schema.audit_log.c
    q = sa.select(a.payload).where(a.action == series_window.ACTION).order_by(a.seq)
    with Ledger(pg_url) as led:
        return [json.loads(p) for p in led.read(lambda c: list(c.scalars(q)))]


def _a_year_on(pg_url: str, series_url: str) -> series_window.WindowReport:
    """Retention run 355 days from now with the default window of 366 days: the store's window then
    starts at TODAY - 10 (a day goes once it began 366 days ago; a TTL of 366 days, on the real
    clock, has removed nothing)."""
    tier = series_tier.Tier.open(series_url)
    policy = Policy(raw_days=7, log_days=None, capacity_days=None, drop_partitions=True)
    try:
        with Ledger(pg_url) as led:
            report = run_retention(led, policy, actor="test", now=time.time() + 355 * DAY_S, tier=tier)
    finally:
        tier.store.close()
    assert report.series is not None
    return report.series


def test_retention_drops_the_store_days_past_its_window_and_verify_names_them_expired(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    run_id, gpu, host = _ingested(pg_url)  # one run across the midnight into TODAY - 10
    first, second = _date(TODAY - 11), _date(TODAY - 10)
    # A store window no longer than the ledger's raw window would drop what it tiers: refused first.
    short = _retention(pg_url, series_url, tmp_path, "--series-days", "7")
    assert short.exit_code == 2 and "--series-days" in short.output and "--raw-days 7" in short.output, short.output
    with Ledger(pg_url) as led:
        assert all(_exists(led, partitions.day_name(t, TODAY - 11)) for t in partitions.KEYS)
    out = _retention(pg_url, series_url, tmp_path)  # tiers both days; the store's window is a year
    assert out.exit_code == 0, out.output
    shown = series_tier.shown_url(series_url)
    assert f"series store {shown}: no day before {_date(TODAY - 365)} to drop" in out.output, out.output

    window = _a_year_on(pg_url, series_url)
    assert (window.before, window.dropped) == (second, [first])
    tier = series_tier.Tier.open(series_url, create=False)
    try:  # the store keeps the day inside its window only, as tiered
        assert tier.store.gpu_intervals(run_id) == [quantum.quantize_gpu(r) for r in gpu if r["seq"] >= N // 2]
        assert tier.store.host_intervals(run_id) == [quantum.quantize_host(r) for r in host if r["seq"] >= N // 2]
    finally:
        tier.store.close()
    assert _entries(pg_url) == [{"series": shown, "before": second, "days": [first]}]

    ok = _verify(pg_url, series_url, tmp_path)
    assert ok.exit_code == 0, ok.output
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert f"NOTE  1 tiered run days ({first}) expired from the series store by retention on {today}" in ok.output
    assert "1 tiered run days checked" in ok.output and "TAMPERED" not in ok.output, ok.output

    assert _a_year_on(pg_url, series_url).dropped == []
    assert len(_entries(pg_url)) == 1  # recorded once


def test_verify_still_fails_for_a_day_deleted_behind_retentions_back(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    run_id, gpu, _ = _ingested(pg_url, devices=1)
    assert _retention(pg_url, series_url, tmp_path).exit_code == 0
    assert _a_year_on(pg_url, series_url).dropped == [_date(TODAY - 11)]
    tier = series_tier.Tier.open(series_url, create=False)
    try:  # the kept day (TODAY - 10) dropped straight from the store: no series.days_dropped entry
        assert tier.store.drop_days_before(date.fromisoformat(_date(TODAY - 9))) >= 1
    finally:
        tier.store.close()
    bad = _verify(pg_url, series_url, tmp_path)
    assert bad.exit_code == 1, bad.output
    device = gpu[0]["device_uuid"]
    where = f"run {run_id} GPU {device} seq {N // 2}-{N - 1}"
    missing = f"{where}: missing from the series store (tiered {_date(TODAY - 10)})"
    assert f"TAMPERED  {missing}" in bad.output, bad.output
    assert "expired from the series store by retention" in bad.output  # the day retention dropped is not missing
    assert f"seq 0-{N // 2 - 1}" not in bad.output


@SKIP_CHDB
def test_tiered_days_a_clickhouse_ttl_removed_first_are_recorded_as_expired(pg_url: str, tmp_path: Path) -> None:
    series_url = f"chdb://{tmp_path}/series"
    run_id, _, _ = _ingested(pg_url, devices=1)
    assert _retention(pg_url, series_url, tmp_path).exit_code == 0  # tiered under a TTL of a year
    tier = series_tier.Tier.open(series_url, series_days=10)  # the window shortened: the TTL follows
    try:
        tier.store.expire()  # what the engine's TTL merges do in the background, now
        assert tier.store.gpu_intervals(run_id) == [] and tier.store.raw_days() == []
        with Ledger(pg_url) as led:
            window = series_window.keep_window(led, tier, actor="test")
    finally:
        tier.store.close()
    assert window.dropped == [_date(TODAY - 11), _date(TODAY - 10)]  # as tiered, though the TTL was first
    ok = _verify(pg_url, series_url, tmp_path)
    assert ok.exit_code == 0 and "2 tiered run days (" in ok.output and "TAMPERED" not in ok.output, ok.output


def _store_days(url: str) -> dict[str, set[int]]:
    name = url.rsplit("schema=", 1)[1]
    with psycopg.connect(PG, autocommit=True) as conn:
        return {t: set(postgres_ddl.days(conn, name, t)) for t in postgres_ddl.TABLES}


def _drop_store_day(url: str, day: int) -> None:
    """As if the store had been made before ``day`` was one of the days it makes ahead."""
    name = url.rsplit("schema=", 1)[1]
    with psycopg.connect(PG, autocommit=True) as conn:
        for table in postgres_ddl.TABLES:
            conn.execute(f"DROP TABLE {name}.{postgres_ddl.days(conn, name, table)[day]}")
    assert all(day not in days for days in _store_days(url).values())


def test_retention_and_the_server_make_the_compact_stores_days_ahead(
    pg_url: str, pg_series_url: str, tmp_path: Path
) -> None:
    _ingested(pg_url, devices=1)
    secret = pg_series_url.replace("postgres@", "postgres:hunter2@")  # trust auth ignores it
    out = _retention(pg_url, secret, tmp_path, "--series-days", "11")  # no TTL: tiered, then dropped at once
    assert out.exit_code == 0, out.output
    shown = series_tier.shown_url(secret)
    assert "hunter2" not in out.output and ":***@" in shown
    line = f"series store {shown}: 1 days before {_date(TODAY - 10)} dropped ({_date(TODAY - 11)})"
    assert line in out.output, out.output
    assert _entries(pg_url) == [{"series": shown, "before": _date(TODAY - 10), "days": [_date(TODAY - 11)]}]
    tomorrow = TODAY + 1
    tier = series_tier.Tier.open(pg_series_url, series_days=30)  # made now: its days ahead are there
    try:
        _drop_store_day(pg_series_url, tomorrow)
        with Ledger(pg_url) as led:
            report = run_retention(led, Policy(raw_days=7, drop_partitions=True), actor="test", tier=tier)
        assert report.series is not None and report.series.made, report.series
        assert all(tomorrow in days for days in _store_days(pg_series_url).values())
    finally:
        tier.store.close()

    # The team server started with --series on this store makes them at start (and hourly).
    from fastapi.testclient import TestClient

    from gpuledger.server.app import create_app

    _drop_store_day(pg_series_url, tomorrow)
    settings = Settings(close_after_days=OPEN_DAYS, lost_after_s=0, series=pg_series_url)
    with TestClient(create_app(pg_url, settings=settings)):  # its lifespan's maintenance has run on entry
        assert all(tomorrow in days for days in _store_days(pg_series_url).values())
