"""Group commit of live pushes into the ClickHouse series store (store/series_batch.py, issue 38
item 5): concurrent pushes' new rows are written by one insert per table, each push acknowledged
only once the insert that carries its rows is stored, on the real PostgreSQL ledger and the real
engine in-process (chDB).

Many agents pushing at once, with lost acknowledgements resent, a ledger commit that fails after
the group's store write succeeded and regrouped final pushes: every interval is stored once and
the rollups are not doubled. A store that fails answers every push of the group 503 and the
ledger keeps none of them. A lone push is written at once; a batch waits for a push on its way.
"""

from __future__ import annotations

import copy
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from ci_support import need_module
from gpuledger.cli.main import cli
from gpuledger.series.clickhouse import ClickHouseSeries
from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, series_tier
from gpuledger.store.errors import RunNotFound
from gpuledger.store.retention import DAY_S
from gpuledger.store.series_batch import GroupCommit, Push
from gpuledger.store.series_live import LiveSeries, SeriesUnavailable, group_token
from server_support import backend_url, bearer, gpu_rows, host_rows, run_doc, setup_accounts
from test_pg_partitions import OPEN_DAYS, TODAY

need_module("chdb", "pip install 'gpuledger[clickhouse]'")

AGENTS, GPUS, PER, BATCHES = 10, 2, 12, 4  # per agent: 4 pushes of 2 GPUs x 12 intervals and 12 host rows
START = (TODAY - 10) * DAY_S  # inside the ten-day raw window of the test stores below
WAIT = 60.0  # s: a thread that takes longer than this is stuck, not slow


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    with backend_url("postgres", tmp_path) as url:
        yield url


def _agent_run(a: int) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """Agent ``a``'s run (GPUs of its own), its GPU and host rows, all its batches'."""
    start = START + 7 * a
    gpu = gpu_rows(PER * BATCHES, devices=GPUS, start=start)
    for r in gpu:
        r["device_uuid"] = f"GPU-grp-{a}-{r['device_uuid']}"
        r["busy_s"] += 0.001 * a  # each run's sums its own
    devices = [
        {"index": d, "uuid": f"GPU-grp-{a}-GPU-{d}", "name": "NVIDIA A100-SXM4-80GB", "memory_total_b": 80 * 2**30}
        for d in range(GPUS)
    ]
    run = {"run": run_doc(started_at=start), "devices": devices, "final": False}
    return run, gpu, host_rows(PER * BATCHES, start=start)


def _push(run: dict[str, Any], gpu: list[dict[str, Any]], host: list[dict[str, Any]], b: int) -> dict[str, Any]:
    lo, hi = b * PER, (b + 1) * PER
    body = copy.deepcopy(run)
    body["gpu_intervals"] = [r for r in gpu if lo <= r["seq"] < hi]
    body["host_intervals"] = [r for r in host if lo <= r["seq"] < hi]
    return body


def _final(run: dict[str, Any], gpu: list[dict[str, Any]], host: list[dict[str, Any]]) -> dict[str, Any]:
    """The whole run again, finished: every batch resent, regrouped as one."""
    body = copy.deepcopy(run)
    end = max(r["t1"] for r in gpu)
    body["run"] |= {"status": "succeeded", "ended_at": end, "exit_code": 0}
    body |= {"gpu_intervals": gpu, "host_intervals": host, "final": True}
    return body


def _app(pg_url: str, store: str, **settings: Any) -> Any:
    series_tier.open_store(store, create=True).close()  # as serve makes its tables before its workers
    return create_app(
        pg_url,
        settings=Settings(close_after_days=OPEN_DAYS, lost_after_s=0, series=store, series_live=True, **settings),
    )


def _commit_fails_once(live: LiveSeries, when: dict[str, int]) -> None:
    """A replica that dies after the store took a push's rows and before the ledger committed:
    the push of run r starting at seq ``when[r]`` fails once, after its (group's) store write."""
    write, failed = live.write, set()

    def wrapped(run_id: str, gpu: list[dict[str, Any]], host: list[dict[str, Any]]) -> int:
        n = write(run_id, gpu, host)
        if run_id in when and run_id not in failed and min(r["seq"] for r in gpu) == when[run_id]:
            failed.add(run_id)
            raise RuntimeError("the replica died before the ledger committed")
        return n

    live.write = wrapped  # type: ignore[method-assign]


def _run_threads(targets: list[Callable[[], None]]) -> None:
    errors: list[BaseException] = []

    def guarded(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [
        threading.Thread(target=guarded, args=(fn,), daemon=True) for fn in targets
    ]  # a stuck one fails the test
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not any(t.is_alive() for t in threads), "a push never came back"
    assert not errors, errors


def test_concurrent_pushes_share_inserts_and_store_every_interval_once(pg_url: str, tmp_path: Path) -> None:
    token = setup_accounts(pg_url).agent_a
    agents = {a: _agent_run(a) for a in range(AGENTS)}
    ids = {a: agents[a][0]["run"]["id"] for a in agents}
    statuses: dict[int, list[int]] = defaultdict(list)
    app = _app(pg_url, f"chdb://{tmp_path}/series")
    with TestClient(app, raise_server_exceptions=False) as client:
        live: LiveSeries = app.state.series_live
        store: ClickHouseSeries = live.reader  # type: ignore[assignment]
        _commit_fails_once(live, {ids[0]: PER, ids[5]: 2 * PER})

        def agent(a: int) -> Callable[[], None]:
            run, gpu, host = agents[a]

            def push() -> None:
                for b in range(BATCHES):
                    body = _push(run, gpu, host, b)
                    got = client.post("/api/v1/ingest", json=body, headers=bearer(token))
                    statuses[a].append(got.status_code)
                    if got.status_code != 200:  # the agent keeps its outbox and sends it again
                        got = client.post("/api/v1/ingest", json=body, headers=bearer(token))
                    assert got.status_code == 200, got.json()["detail"][-400:]
                    # acknowledged: the store holds every row of the push already
                    held_gpu, held_host = store.held(ids[a], body["gpu_intervals"], body["host_intervals"])
                    assert len(held_gpu) == GPUS * PER and len(held_host) == PER, (a, b)
                    if b % 2:  # the acknowledgement was lost: the same push again
                        again = client.post("/api/v1/ingest", json=body, headers=bearer(token))
                        assert again.status_code == 200 and again.json()["gpu_intervals"] == 0, again.text
                got = client.post("/api/v1/ingest", json=_final(run, gpu, host), headers=bearer(token))
                assert got.status_code == 200 and got.json()["gpu_intervals"] == 0, got.text

            return push

        _run_threads([agent(a) for a in agents])
        assert statuses[0].count(500) == 1 and statuses[5].count(500) == 1  # the two failed commits
        grouped = live.group
        assert grouped is not None and grouped.flushes < grouped.pushes  # pushes shared inserts
        rollups = defaultdict(lambda: [0, 0.0, 0.0])
        for r in store.day_rollups(START - DAY_S, START + 2 * DAY_S):
            acc = rollups[r.run_id]
            acc[0] += r.intervals
            acc[1] += r.busy_s or 0.0
            acc[2] += r.energy_j or 0.0
        for a, (_, gpu, host) in agents.items():
            got_gpu, got_host = store.gpu_intervals(ids[a]), store.host_intervals(ids[a])
            assert sorted((r["device_uuid"], r["seq"]) for r in got_gpu) == sorted(
                (r["device_uuid"], r["seq"]) for r in gpu
            )  # each interval once, the failed commit's rows too
            assert [r["seq"] for r in got_host] == [r["seq"] for r in host]
            assert rollups[ids[a]][0] == len(gpu)  # the rollup views not doubled
            assert rollups[ids[a]][1] == pytest.approx(sum(round(r["busy_s"] * 1000) for r in gpu) / 1000)
            assert rollups[ids[a]][2] == pytest.approx(sum(round(r["energy_j"] * 1000) for r in gpu) / 1000)
        months = store.monthly_chargeback(date(1970, 1, 1), date(2100, 1, 1))  # from run_day_rollups
        assert sum(m[4] for m in months) == 5000 * sum(len(g) for _, g, _ in agents.values())
    with Ledger(pg_url) as led:
        for a, (_, gpu, host) in agents.items():
            assert len(led.gpu_intervals(ids[a])) == len(gpu) and len(led.host_intervals(ids[a])) == len(host)


def test_a_store_that_fails_answers_every_push_503_and_the_ledger_keeps_none(pg_url: str, tmp_path: Path) -> None:
    token = setup_accounts(pg_url).agent_a
    agents = {a: _agent_run(a) for a in range(6)}
    app = _app(pg_url, f"chdb://{tmp_path}/series")
    with TestClient(app, raise_server_exceptions=False) as client:
        store: ClickHouseSeries = app.state.series_live.reader
        table = store.layout.table("gpu_intervals")
        store.client.command(f"RENAME TABLE {table} TO {table}_away")  # the store fails every flush
        got: dict[int, Any] = {}

        def push(a: int) -> Callable[[], None]:
            return lambda: got.__setitem__(a, client.post("/api/v1/ingest", json=_push(*agents[a], 0),
                                                          headers=bearer(token)))  # fmt: skip

        _run_threads([push(a) for a in agents])
        for r in got.values():
            assert r.status_code == 503, r.text
            assert "series store" in r.json()["detail"] and r.headers["Retry-After"] == "5"
        with Ledger(pg_url) as led:  # every push rolled back
            assert all(led.gpu_intervals(agents[a][0]["run"]["id"]) == [] for a in agents)
            for a in agents:
                with pytest.raises(RunNotFound):
                    led.get_run(agents[a][0]["run"]["id"])
        store.client.command(f"RENAME TABLE {table}_away TO {table}")
        _run_threads([push(a) for a in agents])  # the outboxes sent again
        assert all(r.status_code == 200 for r in got.values())
        for run, _, _ in agents.values():
            assert len(store.gpu_intervals(run["run"]["id"])) == GPUS * PER


def _rows(a: int, b: int) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    run, gpu, host = _agent_run(a)
    body = _push(run, gpu, host, b)
    return run["run"]["id"], body["gpu_intervals"], body["host_intervals"]


def _inserts(store: ClickHouseSeries) -> int:
    """INSERT statements the engine in this process ran so far (its own counter)."""
    return int(store.client.query("SELECT sum(value) FROM system.events WHERE event = 'InsertQuery'")[0][0] or 0)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveSeries]:
    live = LiveSeries(f"chdb://{tmp_path}/series", create=True, batch_rows=10**6, batch_ms=3_600_000)
    yield live
    live.close()
    live.reader.close()  # type: ignore[union-attr]


def _group_of(live: LiveSeries, pushes: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]]) -> list[Any]:
    """The pushes written by threads that are all on their way before any writes (``pushing``), so
    one group carries them all: each thread's result (rows stored or the exception), and whether
    the store held its rows when its write came back."""
    store: ClickHouseSeries = live.reader  # type: ignore[assignment]
    ready = threading.Barrier(len(pushes))
    out: list[Any] = [None] * len(pushes)

    def push(i: int) -> Callable[[], None]:
        run_id, gpu, host = pushes[i]

        def go() -> None:
            with live.pushing():
                ready.wait(WAIT)
                try:
                    n = live.write(run_id, gpu, host)
                except SeriesUnavailable as e:
                    out[i] = e
                    return
                held_gpu, held_host = store.held(run_id, gpu, host)
                out[i] = (n, len(held_gpu) + len(held_host))

        return go

    _run_threads([push(i) for i in range(len(pushes))])
    return out


def test_a_group_is_one_insert_per_table_and_a_resend_in_another_group_stores_nothing(live: LiveSeries) -> None:
    store: ClickHouseSeries = live.reader  # type: ignore[assignment]
    first = [_rows(a, 0) for a in range(8)]
    store.held_group([(r, g, h) for r, g, h in first])  # the runs' and GPUs' names registered: not counted below
    before = _inserts(store)
    got = _group_of(live, first)
    assert _inserts(store) - before == 2  # one insert into the GPU table, one into the host table
    assert got == [(len(g) + len(h), len(g) + len(h)) for _, g, h in first]  # stored, and held when answered
    assert live.group is not None and live.group.flushes == 1
    # A member whose ledger commit failed is resent with the next batch, grouped with other pushes:
    # a group of other members (another token); its rows the store holds are left out.
    regrouped = [(r, g + _rows(a, 1)[1], h + _rows(a, 1)[2]) for a, (r, g, h) in enumerate(first[:3])]
    regrouped += [_rows(a, 0) for a in range(8, 11)]
    got = _group_of(live, regrouped)
    assert [n for n, _ in got] == [GPUS * PER + PER] * 6  # the new rows only
    for run_id, gpu, host in regrouped:
        assert len(store.gpu_intervals(run_id)) == len(gpu) and len(store.host_intervals(run_id)) == len(host)
    days = defaultdict(int)
    for r in store.day_rollups(START - DAY_S, START + 2 * DAY_S):
        days[r.run_id] += r.intervals
    assert days == {r: len(g) for r, g, _ in [*regrouped, *first[3:]]}  # rollups not doubled


def test_a_failed_flush_fails_every_member_of_its_group(live: LiveSeries) -> None:
    store: ClickHouseSeries = live.reader  # type: ignore[assignment]
    table = store.layout.table("host_intervals")
    pushes = [_rows(a, 0) for a in range(6)]
    store.client.command(f"RENAME TABLE {table} TO {table}_away")
    try:
        got = _group_of(live, pushes)
    finally:
        store.client.command(f"RENAME TABLE {table}_away TO {table}")
    assert all(isinstance(e, SeriesUnavailable) and "did not take the pushes" in str(e) for e in got), got
    assert len({id(e) for e in got}) == len(got)  # each member raises its own
    assert live.group is not None and live.group.flushes == 1


def test_the_group_token_is_its_members_tokens_sorted_and_hashed() -> None:
    assert group_token(["r1:GPU-a:0-11", "r2:GPU-b:0-11"]) == group_token(["r2:GPU-b:0-11", "r1:GPU-a:0-11"])
    assert group_token(["r1:GPU-a:0-11"]) != group_token(["r1:GPU-a:0-12"])
    assert group_token(["r1:GPU-a:0-11"]).startswith("group:sha256:")


class _Recorded:
    """A flush that records each group's runs (the store's part is tested above)."""

    def __init__(self) -> None:
        self.groups: list[list[str]] = []

    def __call__(self, pushes: list[Push]) -> list[int]:
        self.groups.append([p.run_id for p in pushes])
        return [len(p.gpu) for p in pushes]


def _commit(flush: _Recorded) -> GroupCommit:
    return GroupCommit(flush, rows=10**6, wait_s=3600.0, failed=lambda e: SeriesUnavailable(str(e)))


def test_a_lone_push_is_written_at_once_not_after_the_longest_wait() -> None:
    flush = _Recorded()
    group = _commit(flush)
    done: list[int] = []
    _run_threads([lambda: done.append(group.submit("r1", [{"seq": 0}], []))])  # an hour's wait would time out
    with group.pushing():  # as the server calls it: on its way, then writing
        done.append(group.submit("r2", [{"seq": 0}, {"seq": 1}], []))
    assert done == [1, 2] and flush.groups == [["r1"], ["r2"]]


def test_a_batch_waits_for_a_push_on_its_way_and_not_for_one_that_writes_nothing() -> None:
    flush = _Recorded()
    group = _commit(flush)
    on_way, waiting = threading.Event(), threading.Event()
    writes_nothing = threading.Event()

    def late() -> None:  # holds its run's lock, still busy with the ledger
        with group.pushing():
            on_way.set()
            assert waiting.wait(WAIT)
            group.submit("late", [{"seq": 0}], [])

    def early() -> None:
        assert on_way.wait(WAIT)
        with group.pushing():
            waiting.set()  # its group cannot be written before "late" joins it (or an hour passes)
            group.submit("early", [{"seq": 0}], [])

    _run_threads([late, early])
    assert flush.groups == [["early", "late"]]

    def idle() -> None:  # a resend the ledger held already: it never writes
        with group.pushing():
            on_way.set()
            assert writes_nothing.wait(WAIT)

    def alone() -> None:
        assert on_way.wait(WAIT)
        with group.pushing():
            writes_nothing.set()
            group.submit("alone", [{"seq": 0}], [])

    on_way.clear()
    _run_threads([idle, alone])
    assert flush.groups[1:] == [["alone"]]


@pytest.mark.parametrize(("rows", "ms"), [(-1, 1000.0), (10, -1.0), (10, float("nan"))])
def test_bad_batch_settings_are_refused(tmp_path: Path, rows: int, ms: float) -> None:
    with pytest.raises(ValueError, match="0 or more"):
        LiveSeries(f"chdb://{tmp_path}/series", batch_rows=rows, batch_ms=ms)


def test_batch_settings_are_read_from_the_environment_and_zero_rows_is_one_insert_per_push(tmp_path: Path) -> None:
    s = Settings.from_env({"GPULEDGER_SERIES_BATCH_ROWS": "0", "GPULEDGER_SERIES_BATCH_MS": "250"})
    assert (s.series_batch_rows, s.series_batch_ms) == (0, 250.0)
    assert (Settings().series_batch_rows, Settings().series_batch_ms) == (10_000, 1000.0)
    live = LiveSeries(f"chdb://{tmp_path}/series", create=True, batch_rows=0)
    try:
        assert live.group is None
        run_id, gpu, host = _rows(0, 0)
        assert live.write(run_id, gpu, host) == len(gpu) + len(host)
    finally:
        live.close()
        live.reader.close()  # type: ignore[union-attr]


def test_serve_refuses_a_negative_batch(pg_url: str) -> None:
    setup_accounts(pg_url)
    for flag, value in (("--series-batch-rows", "-1"), ("--series-batch-ms", "-5")):
        out = CliRunner().invoke(cli, ["serve", "--db", pg_url, "--unsigned", flag, value])
        assert out.exit_code == 2 and flag in out.output, out.output
