"""Runs whose raw intervals only the series store holds (store/series_segments.py): ``gpuledger
serve --series URL --series-only`` on the real PostgreSQL server, into the compact PostgreSQL store
and ClickHouse on chDB.

The ledger keeps the run, its audit and per stream the seq ranges the store holds, no interval
row; a resent or regrouped batch is stored once, a row overlapping a held one is refused by the
segments, rows a failed ledger commit left in the store are not stored twice, a store that is down
answers 503 and keeps nothing, and such a run pushed to a server without the store is refused
with 503 rather than half-kept in the ledger.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

import test_series_tier as tiers
from gpuledger.cli.main import cli
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, audit, migrations, schema, series_live, series_segments, series_tier, series_verify
from gpuledger.store.engine import Database
from gpuledger.store.series_segments import Segment
from server_support import ServerProcess, bearer, setup_accounts
from test_pg_partitions import OPEN_DAYS
from test_series_live import HALF, N, _pushes, _rename, _schema

pg_url, series_url = tiers.pg_url, tiers.series_url


@pytest.fixture
def pg_store_url(tmp_path: Path) -> Iterator[str]:
    yield from tiers.store_url("postgres", tmp_path, "only_t")


def _server(pg_url: str, series_url: str | None, tmp_path: Path, only: bool = True) -> ServerProcess:
    env = {"GPULEDGER_CLOSE_AFTER_DAYS": str(OPEN_DAYS), "GPULEDGER_LOST_AFTER_S": "0"}
    if series_url is not None:
        # --series-only is --series-live and more: it is not given here, serve sets it
        env |= {"GPULEDGER_SERIES": series_url} | (
            {"GPULEDGER_SERIES_ONLY": "1"} if only else {"GPULEDGER_SERIES_LIVE": "1"}
        )
    return ServerProcess(pg_url, log=tmp_path / "serve.log", env=env)


def _post(server: ServerProcess, token: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + "/api/v1/ingest", json=body, headers=bearer(token), timeout=60)


def _ledger_state(pg_url: str, run_id: str) -> tuple[int, int, dict[str, list[Segment]], bool]:
    """(GPU rows, host rows the ledger holds, the run's segments, whether it is marked)."""
    with Ledger(pg_url) as led:
        gpu, host = len(led.gpu_intervals(run_id)), len(led.host_intervals(run_id))

        def read(conn: sa.Connection) -> tuple[dict[str, list[Segment]], bool]:
            return series_segments.segments(conn, run_id), series_segments.is_marked(conn, run_id)

        return (gpu, host, *led.read(read))


def _whole_segments(body: dict[str, Any]) -> dict[str, list[Segment]]:
    """One segment per stream spanning every row of ``body``."""
    out: dict[str, list[Segment]] = {}
    streams: dict[str, list[dict[str, Any]]] = {"": body["host_intervals"]}
    for r in body["gpu_intervals"]:
        streams.setdefault(r["device_uuid"], []).append(r)
    for stream, rows in streams.items():
        rows = sorted(rows, key=lambda r: r["seq"])
        out[stream] = [Segment(rows[0]["seq"], rows[-1]["seq"], rows[0]["t0"], rows[-1]["t1"])]
    return out


def _store_keys(url: str, run_id: str) -> tuple[list[tuple[str, int]], list[int]]:
    store = series_tier.open_store(url, create=False)
    try:
        gpu, host = store.gpu_intervals(run_id), store.host_intervals(run_id)
        return sorted((r["device_uuid"], r["seq"]) for r in gpu), sorted(r["seq"] for r in host)
    finally:
        store.close()


def _keys(body: dict[str, Any]) -> tuple[list[tuple[str, int]], list[int]]:
    return sorted((r["device_uuid"], r["seq"]) for r in body["gpu_intervals"]), sorted(
        r["seq"] for r in body["host_intervals"]
    )


def test_a_series_only_run_keeps_its_rows_in_the_store_once_and_seq_ranges_in_the_ledger(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    tokens = setup_accounts(pg_url)
    whole, first, final = _pushes()
    run_id = whole["run"]["id"]
    with _server(pg_url, series_url, tmp_path) as server:
        got = _post(server, tokens.agent_a, first)
        assert got.status_code == 200, got.text
        assert got.json()["gpu_intervals"] == 2 * HALF and got.json()["host_intervals"] == HALF
        assert len(got.json()["quarantined"]) == 1  # the GPU the run does not hold: never in the store
        again = _post(server, tokens.agent_a, first)  # the acknowledgement lost: sent again
        assert again.status_code == 200 and again.json()["gpu_intervals"] == 0, again.text
        got = _post(server, tokens.agent_a, final)  # the first half again, grouped with the rest
        assert got.status_code == 200, got.text
        assert got.json()["quarantined"] == []  # the held half is not judged again
        assert got.json()["gpu_intervals"] == 2 * (N - HALF) and got.json()["host_intervals"] == N - HALF
        got = _post(server, tokens.agent_a, final)
        assert got.status_code == 200 and got.json()["gpu_intervals"] == 0 and got.json()["host_intervals"] == 0
    gpu, host, segments, marked = _ledger_state(pg_url, run_id)
    assert (gpu, host, marked) == (0, 0, True)  # no raw row in the ledger
    assert segments == _whole_segments(whole)  # one segment per stream: 3 rows for 3 * N intervals
    assert _store_keys(series_url, run_id) == _keys(whole)  # each interval once


def test_rows_overlapping_what_the_store_holds_are_refused_by_the_segments(
    pg_url: str, pg_store_url: str, tmp_path: Path
) -> None:
    """Overlaps are judged against the neighbouring segments' ends as against stored rows, and a
    gap filled later joins the segments either side of it."""
    tokens = setup_accounts(pg_url)
    whole, first, _ = _pushes()
    run_id = whole["run"]["id"]
    gpu0 = first["gpu_intervals"][0]["device_uuid"]
    mine = sorted((r for r in first["gpu_intervals"] if r["device_uuid"] == gpu0), key=lambda r: r["seq"])
    end = mine[-1]["t1"]  # of seq HALF - 1, the first push's last

    def push(*rows: dict[str, Any]) -> httpx.Response:
        body = copy.deepcopy(first)
        body["gpu_intervals"], body["host_intervals"] = list(rows), []
        return _post(server, tokens.agent_a, body)

    def row(seq: int, t0: float, t1: float) -> dict[str, Any]:
        return {**mine[-1], "seq": seq, "t0": t0, "t1": t1}

    with _server(pg_url, pg_store_url, tmp_path) as server:
        assert _post(server, tokens.agent_a, first).status_code == 200
        got = push(
            {**mine[-1], "seq": HALF + 5},  # a new seq whose times repeat a held row's: starts before it ends
            {**mine[3], "t0": mine[3]["t0"] + 1.0},  # a held seq sent changed: held, not stored again
            row(HALF + 10, end + 50.0, end + 55.0),  # after a gap: a segment of its own
        )
        assert got.status_code == 200 and got.json()["gpu_intervals"] == 1, got.text
        (refused,) = got.json()["quarantined"]
        assert refused["item"] == f"{gpu0} seq {HALF + 5}" and "starts at" in refused["reason"]
        got = push(row(HALF + 8, end + 40.0, end + 52.0))  # ends after seq HALF + 10 starts
        (refused,) = got.json()["quarantined"]
        assert refused["item"] == f"{gpu0} seq {HALF + 8}" and "ends at" in refused["reason"], got.text
        assert _ledger_state(pg_url, run_id)[2][gpu0] == [
            Segment(0, HALF - 1, mine[0]["t0"], end),
            Segment(HALF + 10, HALF + 10, end + 50.0, end + 55.0),
        ]
        got = push(*(row(HALF + k, end + 5.0 * k, end + 5.0 * (k + 1)) for k in range(10)))  # the gap filled
        assert got.status_code == 200 and got.json()["gpu_intervals"] == 10 and got.json()["quarantined"] == []
    assert _ledger_state(pg_url, run_id)[2][gpu0] == [Segment(0, HALF + 10, mine[0]["t0"], end + 55.0)]
    gpu_keys, _ = _store_keys(pg_store_url, run_id)
    assert [q for u, q in gpu_keys if u == gpu0] == list(range(HALF + 11))


def test_rows_a_failed_ledger_commit_left_in_the_store_are_stored_once(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    """A replica killed between the store's write and the ledger's commit: the store holds rows the
    ledger's segments lack; the resend, regrouped, stores only the rows the store lacks."""
    tokens = setup_accounts(pg_url)
    whole, first, final = _pushes()
    run_id = whole["run"]["id"]
    with _server(pg_url, series_url, tmp_path) as server:
        assert _post(server, tokens.agent_a, first).status_code == 200
    gpu = [{c: r.get(c) for c in series_tier.GPU_COLUMNS} for r in whole["gpu_intervals"]]
    host = [{c: r.get(c) for c in series_tier.HOST_COLUMNS} for r in whole["host_intervals"]]
    live = series_live.LiveSeries(series_url)  # what the killed replica wrote: rows past the first half
    try:
        live.write(run_id, [r for r in gpu if HALF <= r["seq"] < HALF + 7], host[HALF : HALF + 7])
    finally:
        live.close()
        if live.shared:
            live.reader.close()  # type: ignore[union-attr]
    with _server(pg_url, series_url, tmp_path) as server:
        got = _post(server, tokens.agent_a, final)
        assert got.status_code == 200 and got.json()["gpu_intervals"] == 2 * (N - HALF), got.text
    assert _ledger_state(pg_url, run_id)[2] == _whole_segments(whole)
    assert _store_keys(series_url, run_id) == _keys(whole)  # once, on ClickHouse too


def test_a_store_that_is_down_answers_503_and_the_segments_stay_as_they_were(
    pg_url: str, pg_store_url: str, tmp_path: Path
) -> None:
    tokens = setup_accounts(pg_url)
    whole, first, final = _pushes()
    run_id, name = whole["run"]["id"], _schema(pg_store_url)
    with _server(pg_url, pg_store_url, tmp_path) as server:
        assert _post(server, tokens.agent_a, first).status_code == 200
        before = _ledger_state(pg_url, run_id)
        _rename(name, f"{name}_away")
        try:
            got = _post(server, tokens.agent_a, final)
            assert got.status_code == 503 and got.headers["Retry-After"] == str(series_live.RETRY_AFTER_S), got.text
            assert _ledger_state(pg_url, run_id) == before  # the ledger's transaction rolled back with it
        finally:
            _rename(f"{name}_away", name)
        got = _post(server, tokens.agent_a, final)
        assert got.status_code == 200 and got.json()["gpu_intervals"] == 2 * (N - HALF), got.text
    assert _ledger_state(pg_url, run_id)[2] == _whole_segments(whole)
    assert _store_keys(pg_store_url, run_id) == _keys(whole)


def test_a_series_only_run_pushed_to_a_server_without_the_store_is_answered_503(
    pg_url: str, pg_store_url: str, tmp_path: Path
) -> None:
    tokens = setup_accounts(pg_url)
    whole, first, final = _pushes()
    run_id = whole["run"]["id"]
    with _server(pg_url, pg_store_url, tmp_path) as server:
        assert _post(server, tokens.agent_a, first).status_code == 200
    before = _ledger_state(pg_url, run_id)
    with _server(pg_url, None, tmp_path) as server:
        got = _post(server, tokens.agent_a, final)
        assert got.status_code == 503 and "series store only" in got.json()["detail"], got.text
    assert _ledger_state(pg_url, run_id) == before  # nothing of it in the ledger's raw tables
    with _server(pg_url, pg_store_url, tmp_path, only=False) as server:  # --series-live: still the store's
        got = _post(server, tokens.agent_a, final)
        assert got.status_code == 200 and got.json()["gpu_intervals"] == 2 * (N - HALF), got.text
    assert _ledger_state(pg_url, run_id)[:3] == (0, 0, _whole_segments(whole))


def test_runs_created_without_series_only_keep_their_rows_in_the_ledger(
    pg_url: str, pg_store_url: str, tmp_path: Path
) -> None:
    tokens = setup_accounts(pg_url)
    whole, first, final = _pushes()
    run_id = whole["run"]["id"]
    with _server(pg_url, pg_store_url, tmp_path, only=False) as server:
        assert _post(server, tokens.agent_a, first).status_code == 200
    with _server(pg_url, pg_store_url, tmp_path) as server:  # the mode marks only the runs it creates
        assert _post(server, tokens.agent_a, final).status_code == 200
    gpu, host, segments, marked = _ledger_state(pg_url, run_id)
    assert (gpu, host, segments, marked) == (2 * N, N, {}, False)


def test_migration_19_adds_the_series_only_tables(pg_url: str) -> None:
    Ledger(pg_url).close()  # migrated to LATEST
    db = Database(pg_url)

    def back_to_18(conn: sa.Connection) -> None:
        conn.execute(sa.text("DROP TABLE series_streams, series_segments, series_day_sums, series_only_runs"))
        conn.execute(sa.delete(schema.schema_version).where(schema.schema_version.c.version >= 19))

    try:
        db.write(back_to_18)
        assert migrations.upgrade(db) == migrations.LATEST
        tables = db.read(lambda conn: set(sa.inspect(conn).get_table_names()))
        assert {"series_segments", "series_day_sums", "series_only_runs"} <= tables
    finally:
        db.close()


@given(st.sets(st.integers(0, 60)), st.randoms(use_true_random=False))
def test_merged_segments_are_the_runs_of_consecutive_seqs(seqs: set[int], rnd: Any) -> None:
    spans = [Segment(q, q, float(q), q + 1.0) for q in seqs]
    rnd.shuffle(spans)
    # merged in any grouping (earlier pushes' segments merged first) gives the same segments
    cut = rnd.randint(0, len(spans))
    got = series_segments.merged([*series_segments.merged(spans[:cut]), *spans[cut:]])
    want: list[Segment] = []
    for q in sorted(seqs):
        if want and want[-1].last_seq + 1 == q:
            want[-1] = Segment(want[-1].first_seq, q, want[-1].t0, q + 1.0)
        else:
            want.append(Segment(q, q, float(q), q + 1.0))
    assert got == want


def test_series_only_is_read_from_the_environment() -> None:
    assert Settings.from_env({"GPULEDGER_SERIES_ONLY": "1"}).series_only is True
    assert Settings.from_env({}).series_only is False


def test_serve_refuses_series_only_without_a_store(pg_url: str) -> None:
    setup_accounts(pg_url)
    out = CliRunner().invoke(cli, ["serve", "--db", pg_url, "--unsigned", "--series-only"])
    assert out.exit_code == 2 and "--series-only" in out.output and "--series URL" in out.output


def test_series_only_settings_open_the_live_store(pg_store_url: str) -> None:
    from gpuledger.server.app import _live_series

    live = _live_series(Settings(series=pg_store_url, series_only=True))  # series_live left False
    try:
        assert live is not None and live.url == pg_store_url
    finally:
        live.close()


def test_a_lost_series_only_run_cannot_end_before_the_last_interval_the_store_holds(
    pg_url: str, pg_store_url: str, tmp_path: Path
) -> None:
    """A lost run's end is bounded below by its last interval: for a series-only run the ledger
    knows it from the segments, not from raw rows."""
    tokens = setup_accounts(pg_url)
    _, first, _ = _pushes()
    last_t1 = max(r["t1"] for r in first["gpu_intervals"])
    lost, ended = copy.deepcopy(first), copy.deepcopy(first)
    lost["gpu_intervals"], lost["host_intervals"] = [], []
    lost["run"] |= {"status": "lost", "ended_at": last_t1 + 10.0}
    ended["gpu_intervals"], ended["host_intervals"] = [], []
    ended["run"] |= {"status": "failed", "ended_at": last_t1 - 100.0, "exit_code": 1}
    with _server(pg_url, pg_store_url, tmp_path) as server:
        assert _post(server, tokens.agent_a, first).status_code == 200
        got = _post(server, tokens.agent_a, lost)
        assert got.status_code == 200, got.text
        got = _post(server, tokens.agent_a, ended)
        assert got.status_code == 409 and "its last interval" in got.json()["detail"], got.text


def test_the_final_push_seals_the_intervals_the_store_holds_and_audit_verify_series_checks_them(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    tokens = setup_accounts(pg_url)
    whole, first, final = _pushes()
    run_id = whole["run"]["id"]
    with _server(pg_url, series_url, tmp_path) as server:
        assert _post(server, tokens.agent_a, first).status_code == 200
        got = _post(server, tokens.agent_a, final)
        assert got.status_code == 200 and got.json()["sealed"], got.text
        assert _post(server, tokens.agent_a, final).json()["sealed"] is False  # sent again: sealed as it was
    with Ledger(pg_url) as led:
        seal = led.read(lambda conn: series_segments.latest_seal(conn, run_id))
        assert seal is not None and seal["series"] == series_tier.shown_url(series_url)
        assert seal["gpu_rows"] == 2 * N and seal["host_rows"] == N and len(seal["gpu"]) == 2
        assert audit.verify(led, close_after_days=OPEN_DAYS).ok
    env = {"GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_CLOSE_AFTER_DAYS": str(OPEN_DAYS)}
    ok = CliRunner().invoke(cli, ["audit", "verify", "--db", pg_url, "--series", series_url], env=env)
    assert ok.exit_code == 0 and "0 tiered run days checked, 1 series-only runs checked" in ok.output, ok.output
    store = series_tier.open_store(series_url, create=False)
    try:
        with Ledger(pg_url) as led:
            checked = series_verify.check(led, store, series_url)
            assert checked.problems == [] and checked.runs_checked == 1
            _tamper(series_url, store, HALF + 3)  # a row of both GPUs changed in the store
            checked = series_verify.check(led, store, series_url)
        assert len(checked.problems) == 2 and all(run_id in p for p in checked.problems), checked.problems
        assert all("sealed series-only run" in p and "energy_mj differ" in p for p in checked.problems), (
            checked.problems
        )
    finally:
        store.close()


def _tamper(url: str, store: Any, seq: int) -> None:
    """The row ``seq`` of every GPU changed in the store (energy + 1 mJ)."""
    if url.startswith("chdb"):
        tiers._tamper(url, store, seq)
        return
    with psycopg.connect(tiers.PG, autocommit=True) as conn:
        conn.execute(f"UPDATE {_schema(url)}.gpu_iv SET energy_mj = energy_mj + 1 WHERE seq = {seq}")


def _pair(pg_url: str, series_url: str, tmp_path: Path) -> tuple[str, str, Any]:
    """The same pushes as a plain run (GPUs renamed, a new run id) to a plain server and as a
    series-only run: (plain run id, series-only run id, tokens)."""
    tokens = setup_accounts(pg_url)
    whole, _, _ = _pushes()
    plain = copy.deepcopy(whole)
    plain["run"]["id"] = str(uuid.uuid4())
    rename = {d["uuid"]: d["uuid"] + "-plain" for d in plain["devices"]}
    for d in plain["devices"]:
        d["uuid"] = rename[d["uuid"]]
    for r in plain["gpu_intervals"]:
        r["device_uuid"] = rename[r["device_uuid"]]
    with _server(pg_url, None, tmp_path) as server:
        assert _post(server, tokens.agent_a, plain).status_code == 200
    with _server(pg_url, series_url, tmp_path) as server:
        got = _post(server, tokens.agent_a, whole)
        assert got.status_code == 200, got.text
    return plain["run"]["id"], whole["run"]["id"], tokens


def test_report_run_and_show_read_a_series_only_run_from_the_store(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    """``report run`` and ``show`` with the store (GPULEDGER_SERIES) give a series-only run the figures of the
    same rows kept in the ledger."""
    plain_id, only_id, _ = _pair(pg_url, series_url, tmp_path)
    want = tiers._report_gpus(pg_url, plain_id, tmp_path)
    got = tiers._report_gpus(pg_url, only_id, tmp_path, series_url)
    drop = ("uuid", "device_uuid", "index")
    assert [{k: v for k, v in g.items() if k not in drop} for g in got] == [
        {k: v for k, v in g.items() if k not in drop} for g in want
    ]
    assert got and all(g["busy"].endswith("%") for g in got), got  # measured, read from the store
    env = {"GPULEDGER_RATES": "", "GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_SERIES": series_url}
    shown = {}
    for run_id in (plain_id, only_id):
        out = CliRunner().invoke(cli, ["show", run_id, "--json", "--db", pg_url], env=env)
        assert out.exit_code == 0, out.output
        shown[run_id] = json.loads(out.output)
    show_plain, show_only = shown[plain_id], shown[only_id]
    assert show_only["intervals"] == show_plain["intervals"] > 0
    assert show_only["busy_gpu_hours"] == pytest.approx(show_plain["busy_gpu_hours"], rel=1e-3)  # store units
    assert show_only["busy_gpu_hours"] > 0
