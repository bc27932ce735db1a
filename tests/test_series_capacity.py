"""Capacity intervals in the series stores (series/capacity.py, issue 38), on the real PostgreSQL
server and both stores (the compact PostgreSQL store and ClickHouse on chDB):

- ``serve --series URL --series-live``: a node agent's capacity push goes into the store inside the
  push's transaction; a resent or regrouped push is held once; a store that is down answers 503
  with Retry-After and nothing of the push is kept (store/series_live.py);
- ``retention run --series URL``: the raw capacity rows are copied into the store and checked
  before the ledger deletes them (store/capacity_tier.py), and ``audit verify --series`` names a
  row the store later lost or changed;
- the capacity report and its FOCUS output read the per GPU, day and host sums, so they are the
  same before and after the raw rows are gone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

import test_series_tier as tiers
from gpuledger.agent.capacity_push import push_capacity
from gpuledger.agent.client import Client, Unreachable
from gpuledger.cli.main import cli
from gpuledger.core.capacity.model import DAY_MS, CapacityInterval, Sighting, States
from gpuledger.series import capacity
from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, capacity_push, capacity_tier, series_live, series_tier
from gpuledger.store.capacity import write_capacity
from gpuledger.store.capacity_queries import day_rows, intervals
from server_support import bearer, enroll, setup_accounts
from test_pg_partitions import OPEN_DAYS, TODAY

pytestmark = pytest.mark.postgres

pg_url, series_url = tiers.pg_url, tiers.series_url
HOST = "node-1"
GPUS = ("GPU-cap-0", "GPU-cap-1")
MIDNIGHT_MS = (TODAY - 3) * DAY_MS
N = 24  # 10 s intervals per GPU, two minutes either side of a midnight three days ago


def _wire(n: int = N) -> list[list[Any]]:
    """The agent's intervals (core/capacity/model.WIRE_COLUMNS): states that vary, energy not
    always measured, crossing a UTC midnight."""
    out = []
    for g, gpu in enumerate(GPUS):
        for k in range(n):
            t0 = MIDNIGHT_MS - 120_000 + k * 10_000
            busy = (k * 1237 + g * 911) % 10_001
            states = [0, 10_000 - busy, busy, 0] if k % 3 else [10_000 - busy, 0, 0, busy]
            energy = None if k % 7 == 3 else round(150.0 + k * 3.3 + g / 3, 4)
            out.append([gpu, HOST, t0, t0 + 10_000, *states, 0, energy])
    return out


def _sightings() -> list[dict[str, Any]]:
    first, last = (MIDNIGHT_MS - 600_000) / 1000, (MIDNIGHT_MS + 600_000) / 1000
    return [{"uuid": g, "name": "NVIDIA L4", "host": HOST, "first_seen": first, "last_seen": last} for g in GPUS]


def _rows(wire: list[list[Any]]) -> list[dict[str, Any]]:
    """The wire rows as the store returns them: ``gpu_capacity`` columns, energy in whole mJ."""
    names = ("gpu_uuid", "host", "t0_ms", "t1_ms", *capacity.STATES[:4], "unmeasured_ms", "energy_j")
    rows = [capacity.quantize(dict(zip(names, r, strict=True))) for r in wire]
    return sorted(rows, key=lambda r: (r["gpu_uuid"], r["t0_ms"]))


def _held(url: str) -> list[dict[str, Any]]:
    store = series_tier.open_store(url, create=False)
    try:
        return store.capacity_intervals(list(GPUS), MIDNIGHT_MS - DAY_MS, MIDNIGHT_MS + DAY_MS)
    finally:
        store.close()


def _node(pg_url: str) -> str:
    """The token of the enrolled node ``HOST``: the only kind that pushes its capacity."""
    setup_accounts(pg_url)
    return enroll(pg_url, HOST)


def _app(pg_url: str, url: str) -> TestClient:
    series_tier.open_store(url).close()  # serve makes the store's tables before its workers start
    settings = Settings(series=url, series_live=True, close_after_days=OPEN_DAYS)
    return TestClient(create_app(pg_url, settings=settings))


def _push(client: TestClient, token: str, wire: list[list[Any]]) -> Any:
    return client.post("/api/v1/capacity", json={"intervals": wire, "gpus": _sightings()}, headers=bearer(token))


def _env(tmp_path: Path) -> dict[str, str]:
    home = str(tmp_path / "home")
    return {"GPULEDGER_RATES": "", "GPULEDGER_HOME": home, "GPULEDGER_CLOSE_AFTER_DAYS": str(OPEN_DAYS)}


def _cli(tmp_path: Path, *args: str) -> Any:
    return CliRunner().invoke(cli, list(args), env=_env(tmp_path))


def _reports(pg_url: str, tmp_path: Path) -> tuple[Any, str]:
    """The capacity report (JSON) and its FOCUS dataset of the days around the midnight."""
    window = ["--from", tiers._date(TODAY - 4), "--to", tiers._date(TODAY - 2), "--db", pg_url]
    report = _cli(tmp_path, "report", "capacity", *window, "--by", "host,gpu", "--format", "json")
    assert report.exit_code == 0, report.output
    focus = _cli(tmp_path, "report", "capacity", *window, "--format", "focus")
    assert focus.exit_code == 0, focus.output
    figures = json.loads(report.output)
    assert [g["gpu"] for g in figures["groups"]] == list(GPUS)  # the pushed intervals are in it
    assert all(g["busy_attributed_gpu_h"] > 0 and g["energy_kwh"] > 0 for g in figures["groups"])
    assert len(focus.output.splitlines()) > 2
    return figures, focus.output


def _retention(pg_url: str, url: str, tmp_path: Path) -> Any:
    args = ["retention", "run", "--db", pg_url, "--keep-logs", "--capacity-days", "1", "--series", url]
    return _cli(tmp_path, *args)


def test_pushes_go_live_into_the_store_once_and_retention_tiers_them_before_the_ledger_drops_them(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    token = _node(pg_url)
    wire = _wire()
    first = [r for r in wire if r[2] < MIDNIGHT_MS]
    with _app(pg_url, series_url) as client:
        got = _push(client, token, first)
        assert got.status_code == 200 and got.json()["stored"] == len(first), got.text
        assert _held(series_url) == _rows(first)  # in the store before the agent was answered
        assert _push(client, token, first).json()["stored"] == 0  # the acknowledgement lost: sent again
        got = _push(client, token, list(reversed(wire)))  # regrouped: the first half again with the rest
        assert got.status_code == 200 and got.json()["stored"] == len(wire) - len(first), got.text
    assert _held(series_url) == _rows(wire)  # each interval once, ClickHouse too
    before = _reports(pg_url, tmp_path)

    out = _retention(pg_url, series_url, tmp_path)
    assert out.exit_code == 0, out.output
    shown = series_tier.shown_url(series_url)
    line = f"capacity: {len(wire)} raw intervals before {tiers._date(TODAY - 1)} deleted (day sums kept)"
    assert f"{line}, tiered into {shown} first" in out.output, out.output
    with Ledger(pg_url) as led:
        assert led.read(lambda c: intervals(c)) == []  # the ledger's raw capacity rows are gone
        assert sum(r[7] for r in led.read(lambda c: day_rows(c, 0, 10**6))) == sum(r[6] for r in wire)
        trail = led.read(lambda c: list(c.exec_driver_sql(
            "SELECT payload FROM audit_log WHERE action = %(a)s ORDER BY seq", {"a": capacity_tier.ACTION}
        ).scalars()))  # fmt: skip
    entries = [json.loads(p) for p in trail]
    assert [(e["host"], e["day"], e["written"]) for e in entries] == [
        (HOST, tiers._date(TODAY - 4), 0), (HOST, tiers._date(TODAY - 3), 0),  # live rows: not copied again
    ]  # fmt: skip
    assert sum(s["rows"] for e in entries for s in e["gpus"].values()) == len(wire)
    assert _held(series_url) == _rows(wire)
    assert _reports(pg_url, tmp_path) == before  # the reports never read the raw rows

    ok = _cli(tmp_path, "audit", "verify", "--db", pg_url, "--series", series_url)
    assert ok.exit_code == 0 and "2 tiered capacity host days checked" in ok.output, ok.output

    # The store's own window passes those days: dropped whole, recorded, and named as expired, not missing.
    assert tiers.expire_store_days(pg_url, series_url, series_days=2, now=time.time()) == 2
    assert _held(series_url) == []
    gone = _cli(tmp_path, "audit", "verify", "--db", pg_url, "--series", series_url)
    span = f"{tiers._date(TODAY - 4)} to {tiers._date(TODAY - 3)}"
    assert gone.exit_code == 0 and f"2 tiered capacity host days ({span}) expired" in gone.output, gone.output
    assert "0 tiered capacity host days checked" in gone.output and "TAMPERED" not in gone.output


def _tamper(url: str) -> None:
    """One interval's busy time (the first GPU's, just after midnight) changed inside the store,
    behind gpuledger's back."""
    t0 = MIDNIGHT_MS + 10_000
    if url.startswith("chdb:"):
        store = series_tier.open_store(url, create=False)
        try:
            store.client.command(  # type: ignore[attr-defined]
                "ALTER TABLE gpuledger.capacity_intervals UPDATE busy_attr_ms = busy_attr_ms + 1 "
                f"WHERE gpu = cityHash64('{GPUS[0]}') AND toUnixTimestamp64Milli(t0) = {t0}",
                {"mutations_sync": 2},
            )
        finally:
            store.close()
        return
    schema = url.rsplit("schema=", 1)[1]
    with psycopg.connect(tiers.PG, autocommit=True) as conn:
        day, t_ms = divmod(t0, DAY_MS)
        conn.execute(
            f"UPDATE {schema}.cap_iv SET busy_attr_ms = coalesce(busy_attr_ms, 0) + 1 WHERE day = %s AND t_ms = %s "
            f"AND gpu = (SELECT key FROM {schema}.gpu_keys WHERE uuid = %s)",
            (day, t_ms, GPUS[0]),
        )


def test_retention_tiers_rows_no_server_wrote_live_and_verify_names_a_changed_row(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    token = _node(pg_url)
    wire = _wire()
    with TestClient(create_app(pg_url, settings=Settings(close_after_days=OPEN_DAYS))) as client:
        assert _push(client, token, wire).json()["stored"] == len(wire)  # a server without --series-live
    before = _reports(pg_url, tmp_path)
    out = _retention(pg_url, series_url, tmp_path)
    assert out.exit_code == 0, out.output
    assert _held(series_url) == _rows(wire)  # copied by retention, checked, then deleted from the ledger
    with Ledger(pg_url) as led:
        assert led.read(lambda c: intervals(c)) == []
    assert _reports(pg_url, tmp_path) == before
    ok = _cli(tmp_path, "audit", "verify", "--db", pg_url, "--series", series_url)
    assert ok.exit_code == 0 and "2 tiered capacity host days checked" in ok.output, ok.output

    _tamper(series_url)
    bad = _cli(tmp_path, "audit", "verify", "--db", pg_url, "--series", series_url)
    assert bad.exit_code == 1, bad.output
    want = f"TAMPERED  capacity of GPU {GPUS[0]} on host {HOST} from {MIDNIGHT_MS} to"
    assert want in bad.output and "sums of busy_attr_ms differ" in bad.output, bad.output
    assert f"(tiered {tiers._date(TODAY - 3)})" in bad.output and GPUS[1] not in bad.output


@pytest.fixture
def pg_store_url(tmp_path: Path) -> Iterator[str]:
    yield from tiers.store_url("postgres", tmp_path, "cap_t")


def test_a_store_that_is_down_refuses_the_capacity_push_with_503_and_keeps_nothing(
    pg_url: str, pg_store_url: str, tmp_path: Path
) -> None:
    """The real agent's capacity push (agent/capacity_push.py) from its local ledger: the 503 is a
    server that is away (Unreachable, with the server's retry hint), its watermarks do not move,
    the server keeps nothing, and the next push stores every interval once in both."""
    token = _node(pg_url)
    wire = _wire()
    local = Ledger(tmp_path / "local.db")
    ivs = [CapacityInterval(r[0], r[1], r[2], r[3], States(*r[4:8]), r[8], r[9]) for r in wire]
    sightings = [Sighting(**s) for s in _sightings()]
    local.write(lambda c: write_capacity(local.database, c, ivs, sightings))
    schema = pg_store_url.rsplit("schema=", 1)[1]
    try:
        with _app(pg_url, pg_store_url) as app_client:
            client = Client("http://testserver", token, transport=app_client._transport)
            capacity_push.register(local, client.server)  # as gpuledger sync does before its first push
            with psycopg.connect(tiers.PG, autocommit=True) as conn:
                conn.execute(f"ALTER SCHEMA {schema} RENAME TO {schema}_away")
            try:
                with pytest.raises(Unreachable, match="503") as err:
                    push_capacity(local, client)
                assert err.value.retry_after_s == series_live.RETRY_AFTER_S
                assert [b.unacknowledged for b in capacity_push.outbox(local)] == [len(wire)]
                with Ledger(pg_url) as led:  # rolled back: no interval, no day sum
                    assert led.read(lambda c: intervals(c)) == [] and led.read(lambda c: day_rows(c, 0, 10**6)) == []
            finally:
                with psycopg.connect(tiers.PG, autocommit=True) as conn:
                    conn.execute(f"ALTER SCHEMA {schema}_away RENAME TO {schema}")
            assert push_capacity(local, client).rows == len(wire)  # sent again from the same watermarks
            assert [b.unacknowledged for b in capacity_push.outbox(local)] == [0]
    finally:
        local.close()
    with Ledger(pg_url) as led:
        assert len(led.read(lambda c: intervals(c))) == len(wire)
    assert _held(pg_store_url) == _rows(wire)


def test_a_batch_with_a_row_the_store_cannot_keep_is_refused_whole(series_url: str) -> None:
    rows = _rows(_wire(3))
    store = series_tier.open_store(series_url)
    try:
        bad = [*rows, {**rows[0], "t0_ms": rows[0]["t0_ms"] + 5, "t1_ms": rows[0]["t0_ms"]}]  # ends before it starts
        with pytest.raises(capacity.BadCapacityRow, match="does not fit"):
            store.write_capacity(bad, capacity.token(bad))
        assert store.capacity_intervals(list(GPUS), 0, MIDNIGHT_MS + DAY_MS) == []
        assert store.write_capacity(rows, capacity.token(rows)) == len(rows)
        assert store.write_capacity(rows[:2], "another token") == 0  # held by (GPU, start)
        assert store.capacity_intervals(list(GPUS), 0, MIDNIGHT_MS + DAY_MS) == rows
    finally:
        store.close()


def test_capacity_token_names_each_gpus_first_and_last_start() -> None:
    rows = [{"gpu_uuid": "GPU-a", "t0_ms": t} for t in (30, 10, 20)] + [{"gpu_uuid": "GPU-b", "t0_ms": 5}]
    assert capacity.token(rows) == "capacity:GPU-a:10-30,GPU-b:5-5"
    many = [{"gpu_uuid": f"GPU-{'x' * 40}-{g}", "t0_ms": 0} for g in range(8)]
    assert capacity.token(many).startswith("capacity:sha256:")
    assert capacity.token(many) == capacity.token(list(reversed(many)))


def test_capacity_older_than_the_stores_own_window_is_deleted_without_copying(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    """The store keeps ``--series-days``: intervals older than that would be dropped from it at once,
    so retention deletes them from the ledger without copying them (the day sums stay)."""
    token = _node(pg_url)
    wire = _wire()
    with TestClient(create_app(pg_url, settings=Settings(close_after_days=OPEN_DAYS))) as client:
        assert _push(client, token, wire).json()["stored"] == len(wire)
    before = _reports(pg_url, tmp_path)
    out = _cli(tmp_path, "retention", "run", "--db", pg_url, "--keep-logs", "--capacity-days", "1",
               "--raw-days", "1", "--series", series_url, "--series-days", "2")  # fmt: skip
    assert out.exit_code == 0 and f"capacity: {len(wire)} raw intervals before" in out.output, out.output
    assert _held(series_url) == []
    with Ledger(pg_url) as led:
        assert led.read(lambda c: intervals(c)) == []
        found = led.read(lambda c: c.exec_driver_sql(
            "SELECT count(*) FROM audit_log WHERE action = %(a)s", {"a": capacity_tier.ACTION}
        ).scalar())  # fmt: skip
    assert found == 0
    assert _reports(pg_url, tmp_path) == before
