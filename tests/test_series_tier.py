"""Tiering (store/series_tier.py): a raw day retention drops from PostgreSQL is first copied into a
series store, read back and checked, on the real PostgreSQL server, into the compact PostgreSQL
store (a schema of its own) and into ClickHouse on chDB (a tmp folder).

A run spanning a midnight is tiered and dropped day by day and reads back whole, equal to the
quantized original; a crash after the copy leaves the day in PostgreSQL and the rerun copies
nothing twice; a tampered tiered row is named by ``audit verify --series``; a bad ``--series``
drops nothing.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from ci_support import in_ci
from gpuledger.cli.main import cli
from gpuledger.reports.cost.rollups import materialise_rollups
from gpuledger.series import quantum
from gpuledger.store import Ledger, audit, partitions, series_tier, series_verify, series_window
from gpuledger.store.retention import DAY_S, Policy, run_retention
from server_support import NOW, backend_url, bearer, devices_doc, gpu_rows, host_rows, run_doc, setup_accounts
from test_pg_partitions import OPEN_DAYS, TODAY, _client, _exists

pytestmark = pytest.mark.postgres

PG = os.environ.get("GPULEDGER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
N = 60  # 5 s intervals per device: 150 s either side of a midnight
NO_CHDB = importlib.util.find_spec("chdb") is None
# Outside CI a machine without the extra skips the chDB half; in CI it runs, and fails for want of chdb.
SKIP_CHDB = pytest.mark.skipif(NO_CHDB and not in_ci(), reason="pip install 'gpuledger[clickhouse]' (CI is not set)")
KINDS = ["postgres", pytest.param("chdb", marks=SKIP_CHDB)]


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    with backend_url("postgres", tmp_path) as url:
        yield url


def store_url(kind: str, tmp_path: Path, prefix: str) -> Iterator[str]:
    """A fresh series store of ``kind``: a chDB folder, or a PostgreSQL schema dropped afterwards."""
    if kind == "chdb":
        yield f"chdb://{tmp_path}/series"
        return
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    yield f"{PG}?schema={name}"
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '30s'")
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.fixture(params=KINDS)
def series_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from store_url(request.param, tmp_path, "tier_t")


def expire_store_days(pg_url: str, series_url: str, series_days: int, now: float) -> int:
    """Let the store drop its whole days past a window of ``series_days`` (as retention does): how many."""
    tier = series_tier.Tier.open(series_url, series_days=series_days)
    try:
        with Ledger(pg_url) as led:
            return len(series_window.keep_window(led, tier, actor="test", now=now).dropped)
    finally:
        tier.store.close()


def _body(start: float, devices: int = 2) -> dict[str, Any]:
    gpu = gpu_rows(N, devices=devices, start=start)
    for r in gpu:  # values finer than the store's units: what comes back is quantized
        r["busy_s"] += 0.0004
        r["energy_j"] += 0.00071
    host = host_rows(N, start=start)
    for r in host:
        r["cpu_s"] += 0.00049
    return {
        "run": run_doc(started_at=start, status="succeeded", ended_at=start + N * 5.0, exit_code=0),
        "devices": devices_doc(devices),
        "gpu_intervals": gpu,
        "host_intervals": host,
        "final": True,
    }


def _ingested(
    pg_url: str, devices: int = 2, *more: dict[str, Any]
) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """A finished run ten days ago across a midnight (and the ``more`` bodies), rolled up and
    sealed; its rows as stored."""
    tokens = setup_accounts(pg_url)
    body = _body((TODAY - 10) * DAY_S - N / 2 * 5.0, devices)
    with _client(pg_url) as client, Ledger(pg_url) as led:
        for b in (body, *more):
            assert client.post("/api/v1/ingest", json=b, headers=bearer(tokens.agent_a)).status_code == 200
        materialise_rollups(led)
        partitions.maintain(led.database)
        run_id = body["run"]["id"]
        return run_id, _rows(led.gpu_intervals(run_id)), _rows(led.host_intervals(run_id))


def _rows(items: list[Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in dataclasses.asdict(i).items() if k != "run_id"} for i in items]


def _days() -> list[str]:
    return [partitions.day_name(t, d) for t in partitions.KEYS for d in (TODAY - 11, TODAY - 10)]


def _retention(led: Ledger, tier: series_tier.Tier | None) -> Any:
    return run_retention(led, Policy(raw_days=7, drop_partitions=True), actor="test", now=NOW, tier=tier)


def _report_gpus(pg_url: str, run_id: str, tmp_path: Path, series: str | None = None) -> list[dict[str, Any]]:
    """``report run``'s per-GPU figures, without the count of rows PostgreSQL holds (read in SQL)."""
    env = {"GPULEDGER_RATES": "", "GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_SERIES": series or ""}
    out = CliRunner().invoke(cli, ["report", "run", run_id, "--db", pg_url, "--format", "json"], env=env)
    assert out.exit_code == 0, out.output
    return [{k: v for k, v in g.items() if k != "intervals"} for g in json.loads(out.output)["gpus"]]


def test_a_tiered_run_is_dropped_from_postgresql_and_reads_back_whole(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    run_id, gpu, host = _ingested(pg_url)
    before = _report_gpus(pg_url, run_id, tmp_path)
    assert before[0]["busy"] != "n/a"
    tier = series_tier.Tier.open(series_url)
    try:
        with Ledger(pg_url) as led:
            report = _retention(led, tier)
            assert report.days is not None and len(report.days.dropped) == 2, report.days
            assert not any(_exists(led, n) for n in _days())
            assert led.gpu_intervals(run_id) == []  # gone from PostgreSQL
            # The store holds the whole run, both days, as the quantized original.
            assert tier.store.gpu_intervals(run_id) == [quantum.quantize_gpu(r) for r in gpu]
            assert tier.store.host_intervals(run_id) == [quantum.quantize_host(r) for r in host]
            assert tier.store.gpu_intervals(run_id) != gpu  # the values were finer than the store's units
            trail = [p for r, p in led.read(lambda c: list(series_verify.tiered(c))) if r == run_id]
            assert sorted(p["day"] for p in trail) == [_date(TODAY - 11), _date(TODAY - 10)]
            assert sum(p["gpu_rows"] for p in trail) == 2 * N and sum(p["host_rows"] for p in trail) == N
            busy = sum(quantum.to_units(r["busy_s"], 1000) for r in gpu)
            assert sum(s["sums"]["busy_ms"] for p in trail for s in p["gpu"].values()) == busy
            assert all(p["series"] == series_tier.shown_url(series_url) for p in trail)
            verified = audit.verify(led, close_after_days=OPEN_DAYS)
            assert verified.ok, verified.problems
            checked = series_verify.check(led, tier.store, series_url)
            assert checked.problems == [] and checked.days_checked == 2
        # Opened with the store, the ledger reads the tiered days back (export, show, report run).
        with Ledger(pg_url, series=series_url) as led:
            assert _rows(led.gpu_intervals(run_id)) == [quantum.quantize_gpu(r) for r in gpu]
            assert _rows(led.host_intervals(run_id)) == [quantum.quantize_host(r) for r in host]
            one = gpu[0]["device_uuid"]
            mine = [quantum.quantize_gpu(r) for r in gpu if r["device_uuid"] == one]
            assert _rows(led.gpu_intervals(run_id, one)) == mine
        # report run reads the run through Ledger.gpu_intervals: whole with GPULEDGER_SERIES, empty without
        assert _report_gpus(pg_url, run_id, tmp_path)[0]["busy"] == "n/a"
        assert _report_gpus(pg_url, run_id, tmp_path, series_url) == before
    finally:
        tier.store.close()


def _date(day: int) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(day * DAY_S))


class _Crashing:
    """The real store, but the process dies (raises) right after a write has stored its rows."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def write(self, *args: Any, **kwargs: Any) -> int:
        self.store.write(*args, **kwargs)
        raise RuntimeError("killed after the copy")


class _Counting(_Crashing):
    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.written: list[int] = []

    def write(self, *args: Any, **kwargs: Any) -> int:
        self.written.append(self.store.write(*args, **kwargs))
        return self.written[-1]


def test_a_crash_between_copy_and_drop_keeps_the_day_and_the_rerun_copies_nothing_twice(
    pg_url: str, series_url: str
) -> None:
    run_id, gpu, _ = _ingested(pg_url)
    tier = series_tier.Tier.open(series_url)
    try:
        with Ledger(pg_url) as led:
            with pytest.raises(RuntimeError, match="killed after the copy"):
                _retention(led, series_tier.Tier(_Crashing(tier.store), tier.url))  # type: ignore[arg-type]
            assert all(_exists(led, n) for n in _days())  # nothing dropped
            assert len(led.gpu_intervals(run_id)) == 2 * N
            assert list(led.read(lambda c: list(series_verify.tiered(c)))) == []  # nothing recorded
            counting = _Counting(tier.store)
            report = _retention(led, series_tier.Tier(counting, tier.url))  # type: ignore[arg-type]
            assert report.days is not None and len(report.days.dropped) == 2, report.days
            # The first day's rows were in the store already: its token stored nothing again.
            assert counting.written[0] == 0 and sum(counting.written) == N + N // 2  # the second day's rows
            assert tier.store.gpu_intervals(run_id) == [quantum.quantize_gpu(r) for r in gpu]  # each once
            assert audit.verify(led, close_after_days=OPEN_DAYS).ok
    finally:
        tier.store.close()


def _tamper(url: str, store: Any, seq: int) -> None:
    if url.startswith("chdb"):
        table = store.layout.local("gpu_intervals")
        store.client.command(f"ALTER TABLE {table} UPDATE energy_mj = energy_mj + 1 WHERE seq = {seq}",
                             {"mutations_sync": 2})  # fmt: skip
        return
    schema = url.rsplit("schema=", 1)[1]
    with psycopg.connect(PG, autocommit=True) as conn:
        assert conn.execute(f"UPDATE {schema}.gpu_iv SET energy_mj = energy_mj + 1 WHERE seq = {seq}").rowcount == 1


def test_audit_verify_series_names_a_changed_tiered_row(pg_url: str, series_url: str, tmp_path: Path) -> None:
    run_id, gpu, _ = _ingested(pg_url, devices=1)
    tier = series_tier.Tier.open(series_url)
    with Ledger(pg_url) as led:
        _retention(led, tier)
    env = {"GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_CLOSE_AFTER_DAYS": str(OPEN_DAYS)}
    args = ["audit", "verify", "--db", pg_url, "--series", series_url]
    try:
        ok = CliRunner().invoke(cli, args, env=env)
        assert ok.exit_code == 0, ok.output
        assert "2 tiered run days checked" in ok.output
        _tamper(series_url, tier.store, N // 2 + 3)  # a row of the second day (the first seq after midnight)
    finally:
        tier.store.close()
    bad = CliRunner().invoke(cli, args, env=env)
    assert bad.exit_code == 1, bad.output
    device = gpu[0]["device_uuid"]
    line = f"TAMPERED  run {run_id} GPU {device} seq {N // 2}-{N - 1}: sums of energy_mj differ from those tiered"
    assert line in bad.output, bad.output
    assert bad.output.count("TAMPERED") == 1  # the first day and the host are as tiered
    # Without --series the ledger alone still verifies.
    plain = CliRunner().invoke(cli, args[:4], env=env)
    assert plain.exit_code == 0, plain.output


@pytest.mark.parametrize(
    "url, code, words",
    [
        ("ftp://host/x", 2, "no series store for scheme 'ftp'"),
        ("postgresql://nobody:secret@127.0.0.1:1/none", 1, "--series postgresql://nobody:***@127.0.0.1:1/none"),
    ],
)
def test_a_bad_series_url_is_a_clear_error_and_drops_nothing(
    pg_url: str, tmp_path: Path, url: str, code: int, words: str
) -> None:
    run_id, _, _ = _ingested(pg_url, devices=1)
    env = {"GPULEDGER_RATES": "", "GPULEDGER_HOME": str(tmp_path / "home")}
    args = ["retention", "run", "--db", pg_url, "--drop-partitions", "--keep-logs", "--keep-capacity", "--series", url]
    out = CliRunner().invoke(cli, args, env=env)
    assert out.exit_code == code, out.output
    assert out.output.startswith("Error: ") or "Error: " in out.output, out.output
    assert words in out.output and "secret" not in out.output, out.output
    with Ledger(pg_url) as led:
        assert all(_exists(led, n) for n in _days())
        assert len(led.gpu_intervals(run_id)) == N
    without = [a for a in args if a != "--drop-partitions"]  # a series store: days are dropped by default
    default = CliRunner().invoke(cli, without, env=env)
    assert default.exit_code == code and words in default.output, default.output
    rewrite = CliRunner().invoke(cli, [*without, "--rewrite-intervals"], env=env)
    assert rewrite.exit_code == 2 and "cannot be given with --rewrite-intervals" in rewrite.output, rewrite.output
    with Ledger(pg_url) as led:
        assert all(_exists(led, n) for n in _days()) and len(led.gpu_intervals(run_id)) == N


def test_a_series_store_in_the_environment_makes_retention_tier_and_drop_days(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    """GPULEDGER_SERIES on a PostgreSQL ledger: `retention run` keeps the curves in the store, so it
    tiers and drops whole days instead of thinning them to 1-minute rows; --rewrite-intervals keeps
    the old way."""
    run_id, _, _ = _ingested(pg_url)
    env = {"GPULEDGER_RATES": "", "GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_SERIES": series_url}
    args = ["retention", "run", "--db", pg_url, "--keep-logs", "--keep-capacity"]
    kept = CliRunner().invoke(cli, [*args, "--rewrite-intervals"], env=env)
    assert kept.exit_code == 0, kept.output
    assert "raw intervals:" not in kept.output and "runs to 60 s" in kept.output  # thinned, not dropped
    with Ledger(pg_url) as led:
        assert all(_exists(led, n) for n in _days())
        gpu = _rows(led.gpu_intervals(run_id))  # the 1-minute rows the store is to receive
        assert 0 < len(gpu) < N
    out = CliRunner().invoke(cli, args, env=env)
    assert out.exit_code == 0, out.output
    assert "raw intervals: 2 days dropped" in out.output and "tiered into" in out.output, out.output
    with Ledger(pg_url) as led:
        assert not any(_exists(led, n) for n in _days()) and led.gpu_intervals(run_id) == []
    tier = series_tier.Tier.open(series_url)
    try:
        assert tier.store.gpu_intervals(run_id) == [quantum.quantize_gpu(r) for r in gpu]
    finally:
        tier.store.close()


def test_db_migrate_series_tiers_a_populated_ledger_resumably(pg_url: str, series_url: str, tmp_path: Path) -> None:
    later = _body((TODAY - 9) * DAY_S + 3600, devices=1)  # a second finished run two days on
    running = _body((TODAY - 8) * DAY_S + 3600, devices=1)
    running["run"].update(status="running", ended_at=None, exit_code=None)
    running["final"] = False
    run_id, gpu, host = _ingested(pg_url, 2, later, running)
    env = {"GPULEDGER_RATES": "", "GPULEDGER_HOME": str(tmp_path / "home")}
    env["GPULEDGER_CLOSE_AFTER_DAYS"] = str(OPEN_DAYS)
    verify = ["audit", "verify", "--db", pg_url]
    assert CliRunner().invoke(cli, verify, env=env).exit_code == 0
    migrate = ["db", "migrate", "--db", pg_url, "--series", series_url]
    dry = CliRunner().invoke(cli, [*migrate, "--dry-run"], env=env)
    assert dry.exit_code == 0, dry.output
    assert f"would copy 3 days ({5 * N} rows)" in dry.stdout, dry.output
    assert "still recording" in dry.stderr and f"{_date(TODAY - 11)}: would copy {N + N // 2} rows" in dry.stderr
    tier = series_tier.Tier.open(series_url)
    try:
        assert tier.store.gpu_intervals(run_id) == []  # a dry run copies nothing
    finally:
        tier.store.close()
    first = CliRunner().invoke(cli, migrate, env=env)
    assert first.exit_code == 0, first.output
    assert "copied and checked 3 days" in first.stdout and "[1/4]" in first.stderr, first.output
    tier = series_tier.Tier.open(series_url)
    try:
        assert tier.store.gpu_intervals(run_id) == [quantum.quantize_gpu(r) for r in gpu]
        assert tier.store.host_intervals(run_id) == [quantum.quantize_host(r) for r in host]
        assert tier.store.gpu_intervals(running["run"]["id"]) == []  # retention may not drop its day
    finally:
        tier.store.close()
    with Ledger(pg_url) as led:  # nothing dropped: PostgreSQL still holds every row
        assert len(led.gpu_intervals(run_id)) == 2 * N and all(_exists(led, n) for n in _days())
    again = CliRunner().invoke(cli, migrate, env=env)
    assert again.exit_code == 0, again.output
    assert "copied and checked 0 days (0 rows); 3 days already tiered" in again.stdout, again.output
    for args in (verify, [*verify, "--series", series_url]):
        after = CliRunner().invoke(cli, args, env=env)
        assert after.exit_code == 0, after.output
    assert "3 tiered run days checked" in after.output  # each run's day once, though migrate ran twice


def test_serve_refuses_a_series_url_that_names_no_store(pg_url: str, tmp_path: Path) -> None:
    setup_accounts(pg_url)
    env = {"GPULEDGER_HOME": str(tmp_path / "home")}
    args = ["serve", "--db", pg_url, "--unsigned", "--checkpoint", str(tmp_path / "cp"), "--series", "ftp://x/y"]
    before = dict(os.environ)
    out = CliRunner().invoke(cli, args, env=env)
    assert out.exit_code == 2 and "no series store for scheme 'ftp'" in out.output, out.output
    # refused before it set anything: later servers and audit runs in this process would inherit the checkpoint
    assert dict(os.environ) == before
