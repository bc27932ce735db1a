"""Live ingest into a series store (store/series_live.py): ``gpuledger serve --series URL
--series-live`` writes each push's new intervals into the store before it acknowledges the push,
on the real PostgreSQL server, into the compact PostgreSQL store and ClickHouse on chDB.

A resent or regrouped batch is held once in the store, a row the ledger refuses never reaches it;
a store that is down answers 503 with a retry hint and keeps nothing of the push; retention later
drops the live days without copying them again, and ``audit verify --series`` passes.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from click.testing import CliRunner

import test_series_tier as tiers
from gpuledger.agent.client import Client, Unreachable
from gpuledger.agent.sync import sync
from gpuledger.cli.main import cli
from gpuledger.reports.cost.rollups import materialise_rollups
from gpuledger.series import quantum
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, audit, partitions, pushes, series_live, series_tier, series_verify
from gpuledger.store.retention import DAY_S
from server_support import ServerProcess, bearer, setup_accounts
from test_agent_outbox import _local_run
from test_pg_partitions import OPEN_DAYS, TODAY

pytestmark = pytest.mark.postgres

pg_url, series_url = tiers.pg_url, tiers.series_url
N = tiers.N  # 5 s intervals per device, across a midnight ten days ago
HALF = N // 2


def _server(pg_url: str, series_url: str, tmp_path: Path) -> ServerProcess:
    env = {
        "GPULEDGER_SERIES": series_url, "GPULEDGER_SERIES_LIVE": "1", "GPULEDGER_CLOSE_AFTER_DAYS": str(OPEN_DAYS),
        "GPULEDGER_LOST_AFTER_S": "0",
    }  # fmt: skip
    return ServerProcess(pg_url, log=tmp_path / "serve.log", env=env)


def _pushes() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The whole run (``tiers._body``: 2 GPUs and the host, N intervals each, finished); its first
    half as a running run's push with a row of a GPU the run does not hold; and the whole run again
    as its final push (the first half resent, regrouped with the second)."""
    whole = tiers._body((TODAY - 10) * DAY_S - N / 2 * 5.0)
    first = copy.deepcopy(whole)
    first["run"] = {k: v for k, v in first["run"].items() if k not in ("status", "ended_at", "exit_code")}
    first["final"] = False
    first["gpu_intervals"] = [r for r in first["gpu_intervals"] if r["seq"] < HALF]
    first["host_intervals"] = [r for r in first["host_intervals"] if r["seq"] < HALF]
    stranger = {**first["gpu_intervals"][0], "device_uuid": "GPU-not-this-runs"}
    first["gpu_intervals"].append(stranger)  # refused by the ledger (quarantined): never in the store
    return whole, first, copy.deepcopy(whole)


def _post(server: ServerProcess, token: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + "/api/v1/ingest", json=body, headers=bearer(token), timeout=60)


def _stored(store: Any, run_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return store.gpu_intervals(run_id), store.host_intervals(run_id)


def test_pushes_are_written_live_once_and_retention_drops_them_without_copying(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    tokens = setup_accounts(pg_url)
    whole, first, final = _pushes()
    run_id = whole["run"]["id"]
    with _server(pg_url, series_url, tmp_path) as server:
        got = _post(server, tokens.agent_a, first)
        assert got.status_code == 200, got.text
        assert got.json()["gpu_intervals"] == 2 * HALF and len(got.json()["quarantined"]) == 1
        again = _post(server, tokens.agent_a, first)  # the acknowledgement lost: sent again
        assert again.status_code == 200 and again.json()["gpu_intervals"] == 0, again.text
        got = _post(server, tokens.agent_a, final)  # the first half again, grouped with the rest
        assert got.status_code == 200 and got.json()["gpu_intervals"] == 2 * (N - HALF), got.text
        assert _post(server, tokens.agent_a, final).status_code == 200
    with Ledger(pg_url) as led:
        materialise_rollups(led)
        partitions.maintain(led.database)
        want_gpu = [quantum.quantize_gpu(r) for r in tiers._rows(led.gpu_intervals(run_id))]
        want_host = [quantum.quantize_host(r) for r in tiers._rows(led.host_intervals(run_id))]
    tier = series_tier.Tier.open(series_url)
    counting = tiers._Counting(tier.store)
    try:
        gpu, host = _stored(tier.store, run_id)  # each interval once, as the agent sent it
        assert gpu == want_gpu and host == want_host
        assert len(gpu) == len(whole["gpu_intervals"]) and len(host) == len(whole["host_intervals"])
        for key in ("busy_s", "energy_j", "samples"):  # the sums the agent sent, to the store's units
            assert sum(r[key] for r in gpu) == pytest.approx(sum(r[key] for r in whole["gpu_intervals"]), abs=0.2)
        assert sum(r["cpu_s"] for r in host) == pytest.approx(sum(r["cpu_s"] for r in whole["host_intervals"]), abs=0.1)
        with Ledger(pg_url) as led:
            report = tiers._retention(led, series_tier.Tier(counting, tier.url))  # type: ignore[arg-type]
            assert report.days is not None and len(report.days.dropped) == 2, report.days
            assert sum(counting.written) == 0  # the live days were not copied again
            assert led.gpu_intervals(run_id) == []
            assert _stored(tier.store, run_id) == (want_gpu, want_host)  # still once (ClickHouse too)
            trail = [p for r, p in led.read(lambda c: list(series_verify.tiered(c))) if r == run_id]
            assert sum(p["gpu_rows"] for p in trail) == 2 * N and sum(p["host_rows"] for p in trail) == N
            verified = audit.verify(led, close_after_days=OPEN_DAYS)
            assert verified.ok, verified.problems
            checked = series_verify.check(led, tier.store, series_url)
            assert checked.problems == [] and checked.days_checked == 2
    finally:
        tier.store.close()


@pytest.fixture
def pg_store_url(tmp_path: Path) -> Iterator[str]:
    yield from tiers.store_url("postgres", tmp_path, "live_t")


def _schema(url: str) -> str:
    return url.rsplit("schema=", 1)[1]


def _rename(schema: str, to: str) -> None:
    with psycopg.connect(tiers.PG, autocommit=True) as conn:
        conn.execute(f"ALTER SCHEMA {schema} RENAME TO {to}")


def test_a_store_that_is_down_refuses_the_push_with_503_and_keeps_nothing(
    pg_url: str, pg_store_url: str, tmp_path: Path
) -> None:
    tokens = setup_accounts(pg_url)
    whole, first, final = _pushes()
    run_id, schema = whole["run"]["id"], _schema(pg_store_url)
    with _server(pg_url, pg_store_url, tmp_path) as server:
        assert _post(server, tokens.agent_a, first).status_code == 200
        _rename(schema, f"{schema}_away")  # the store's tables are gone for the server
        try:
            got = _post(server, tokens.agent_a, final)
            assert got.status_code == 503, got.text
            assert got.headers["Retry-After"] == str(series_live.RETRY_AFTER_S)
            assert "series store" in got.json()["detail"] and "retry" in got.json()["detail"]
            with Ledger(pg_url) as led:  # the ledger's transaction was rolled back with it
                assert len(led.gpu_intervals(run_id)) == 2 * HALF
        finally:
            _rename(f"{schema}_away", schema)
        got = _post(server, tokens.agent_a, final)  # the agent's outbox sends it again
        assert got.status_code == 200 and got.json()["gpu_intervals"] == 2 * (N - HALF), got.text
    store = series_tier.open_store(pg_store_url, create=False)
    try:
        assert len(store.gpu_intervals(run_id)) == 2 * N and len(store.host_intervals(run_id)) == N
    finally:
        store.close()


def test_the_agent_keeps_its_outbox_while_the_store_is_down_and_sends_it_after(
    pg_url: str, pg_store_url: str, tmp_path: Path
) -> None:
    """The real agent (``gpuledger sync``'s code) against the real server: the 503 is a server
    that is away (Unreachable, with the server's retry hint), the outbox keeps every row, and the
    next sync stores the run whole, in the ledger and in the store, once."""
    token = setup_accounts(pg_url).agent_a
    local = Ledger(tmp_path / "local.db")
    run_id = _local_run(local, 300)
    gpu_sent, host_sent = local.gpu_intervals(run_id), local.host_intervals(run_id)
    schema = _schema(pg_store_url)
    with _server(pg_url, pg_store_url, tmp_path) as server, Client(server.url, token) as client:
        pushes.register(local, server.url, [run_id])
        _rename(schema, f"{schema}_away")
        try:
            with pytest.raises(Unreachable, match="503") as err:
                sync(local, client, spooled=())
            assert err.value.retry_after_s == series_live.RETRY_AFTER_S
            state = pushes.get(local, server.url, run_id)
            assert state is not None and not state.done and state.gpu_next == {} and state.host_next == 0
        finally:
            _rename(f"{schema}_away", schema)
        assert sync(local, client, spooled=()).done == [run_id]
    with Ledger(pg_url) as led:
        assert len(led.gpu_intervals(run_id)) == len(gpu_sent) and len(led.host_intervals(run_id)) == len(host_sent)
    store = series_tier.open_store(pg_store_url, create=False)
    try:
        gpu, host = _stored(store, run_id)
        assert [(r["device_uuid"], r["seq"]) for r in gpu] == [(g.device_uuid, g.seq) for g in gpu_sent]
        assert [r["seq"] for r in host] == [h.seq for h in host_sent]
        assert sum(r["busy_s"] for r in gpu) == pytest.approx(sum(g.busy_s or 0 for g in gpu_sent))
    finally:
        store.close()
        local.close()


def test_rows_a_failed_ledger_commit_left_in_the_store_are_not_written_twice(series_url: str) -> None:
    """A replica killed between the store's write and the ledger's commit: the resend, batched
    otherwise (another token), stores only the rows the store lacks, on ClickHouse too."""
    whole = tiers._body((TODAY - 10) * DAY_S)
    run_id = whole["run"]["id"]  # ledger rows, every column
    gpu = [{c: r.get(c) for c in series_tier.GPU_COLUMNS} for r in whole["gpu_intervals"]]
    host = [{c: r.get(c) for c in series_tier.HOST_COLUMNS} for r in whole["host_intervals"]]
    live = series_live.LiveSeries(series_url, create=True)
    try:
        assert live.write(run_id, [r for r in gpu if r["seq"] < HALF], host[:HALF]) == 2 * HALF + HALF
        live.write(run_id, gpu, host)
        store = live._idle[0]
        assert len(store.gpu_intervals(run_id)) == 2 * N and len(store.host_intervals(run_id)) == N
    finally:
        live.close()
        if live.shared:
            live.reader.close()  # type: ignore[union-attr]


def test_batch_token_names_the_run_device_and_seq_range() -> None:
    one = [{"device_uuid": "GPU-a", "seq": s} for s in (7, 3, 5)]
    assert series_live.batch_token("r1", one, []) == "r1:GPU-a:3-7"
    assert series_live.batch_token("r1", one, [{"seq": 2}, {"seq": 9}]) == "r1:GPU-a:3-7,host:2-9"
    many = [{"device_uuid": f"GPU-{'x' * 40}-{d}", "seq": 0} for d in range(8)]
    token = series_live.batch_token("r1", many, [])
    assert token.startswith("r1:sha256:") and token == series_live.batch_token("r1", list(reversed(many)), [])


@pytest.mark.parametrize(("text", "on"), [("1", True), ("true", True), ("ON", True), ("0", False), ("no", False)])
def test_series_live_is_read_from_the_environment(text: str, on: bool) -> None:
    assert Settings.from_env({"GPULEDGER_SERIES_LIVE": text}).series_live is on


def test_a_bad_series_live_value_names_the_variable() -> None:
    with pytest.raises(SystemExit, match="GPULEDGER_SERIES_LIVE='maybe'"):
        Settings.from_env({"GPULEDGER_SERIES_LIVE": "maybe"})


def test_serve_refuses_series_live_without_a_store_or_on_sqlite(pg_url: str, tmp_path: Path) -> None:
    setup_accounts(pg_url)
    out = CliRunner().invoke(cli, ["serve", "--db", pg_url, "--unsigned", "--series-live"])
    assert out.exit_code == 2 and "--series-live" in out.output and "--series URL" in out.output
    sqlite = f"sqlite:///{tmp_path}/team.db"
    Ledger(sqlite, migrate=True).close()
    store = f"chdb://{tmp_path}/series"
    out = CliRunner().invoke(cli, ["serve", "--db", sqlite, "--unsigned", "--series", store, "--series-live"])
    assert out.exit_code == 2 and "PostgreSQL" in out.output, out.output
