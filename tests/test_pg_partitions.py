"""PostgreSQL: raw intervals partitioned by UTC day; retention drops old days, never rows.

On the real PostgreSQL server (a private schema per test): the server creates day partitions
ahead, a push lands in its day's partition, a retransmitted interval is dropped, retention drops a
day whose runs are all rolled up and sealed and keeps a day a running run holds, ``audit verify``
passes after, and migration 18 converts a populated ledger keeping every row.
"""

from __future__ import annotations

import calendar
import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

import statement_support
from gpuledger.reports.cost.rollups import materialise_rollups
from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, audit, migrations, partition_days, partitions, rollup_stale, schema
from gpuledger.store.engine import Database
from gpuledger.store.retention import DAY_S, Policy, run_retention
from server_support import NOW, backend_url, bearer, devices_doc, gpu_rows, host_rows, run_doc, setup_accounts
from statement_support import DELETE_ROWS

pytestmark = pytest.mark.postgres
statements = statement_support.statements

OPEN_DAYS = 62  # pushes of runs ten days old: no month may have closed (store/closed_months.py)
TODAY = math.floor(NOW / DAY_S)
N = 100  # 5 s intervals per device and run


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    with backend_url("postgres", tmp_path) as url:
        yield url


def _client(url: str) -> TestClient:
    return TestClient(create_app(url, settings=Settings(close_after_days=OPEN_DAYS, lost_after_s=0)))


def _body(start: float, *, final: bool = True, n: int = N) -> dict[str, Any]:
    end = start + n * 5.0
    fields = {"status": "succeeded", "ended_at": end, "exit_code": 0} if final else {"status": "running"}
    return {
        "run": run_doc(started_at=start, **fields),
        "devices": devices_doc(1),
        "gpu_intervals": gpu_rows(n, devices=1, start=start),
        "host_intervals": host_rows(n, start=start),
        "final": final,
    }


def _where(led: Ledger, table: str, run_id: str) -> dict[str, int]:
    """Rows of ``run_id`` per partition they are stored in (their tableoid)."""
    q = f"SELECT tableoid::regclass::text, count(*) FROM {table} WHERE run_id = :r GROUP BY 1"
    return dict(led.read(lambda c: c.execute(sa.text(q), {"r": run_id}).all()))  # type: ignore[arg-type]


def _exists(led: Ledger, name: str) -> bool:
    return led.read(lambda c: c.execute(sa.text("SELECT to_regclass(:n) IS NOT NULL"), {"n": name}).scalar())


def _sums(led: Ledger) -> tuple[Any, ...]:
    q = "SELECT count(*), sum(busy_s), sum(energy_j), sum(seq) FROM gpu_intervals"
    qh = "SELECT count(*), sum(cpu_s), sum(read_b) FROM host_intervals"
    return led.read(lambda c: (*c.exec_driver_sql(q).one(), *c.exec_driver_sql(qh).one()))


def test_the_server_creates_day_partitions_ahead_of_the_clock(pg_url: str) -> None:
    setup_accounts(pg_url)
    wanted = [partitions.day_name(t, d) for t in partitions.KEYS for d in range(TODAY, TODAY + 3)]
    with _client(pg_url), Ledger(pg_url) as led:
        deadline = time.monotonic() + 60
        while not all(_exists(led, n) for n in wanted) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(_exists(led, n) for n in wanted), [n for n in wanted if not _exists(led, n)]
        for table, key in partitions.KEYS.items():
            assert led.read(lambda c, t=table: partitions.is_partitioned(c, t))
            pk = led.read(lambda c, t=table: c.execute(sa.text(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = to_regclass(:t) AND contype = 'p'"
            ), {"t": t}).scalar())  # fmt: skip
            assert pk == f"PRIMARY KEY ({', '.join(key)})"


def _defaults(led: Ledger) -> dict[str, int]:
    """Rows in each partitioned table's default partition."""
    q = "SELECT count(*) FROM {}"
    return {
        t: led.read(lambda c, t=t: c.exec_driver_sql(q.format(partitions.default_name(t))).scalar())
        for t in partitions.SPECS
    }


def test_a_push_lands_in_its_days_a_retransmit_is_dropped_and_strays_are_moved_out(pg_url: str) -> None:
    tokens = setup_accounts(pg_url)
    midnight = (TODAY - 1) * DAY_S  # half the run before it: a day no partition was made for yet
    body = _body(midnight - N / 2 * 5.0)
    run_id = body["run"]["id"]
    before, yesterday = partitions.day_name("gpu_intervals", TODAY - 2), partitions.day_name("gpu_intervals", TODAY - 1)
    with _client(pg_url) as client, Ledger(pg_url) as led:
        partitions.maintain(led.database)  # as the server does at start: yesterday onwards
        first = client.post("/api/v1/ingest", json=body, headers=bearer(tokens.agent_a))
        assert first.status_code == 200, first.text
        assert first.json()["gpu_intervals"] == N
        assert _where(led, "gpu_intervals", run_id) == {before: N // 2, yesterday: N // 2}  # its day made first
        assert _where(led, "host_intervals", run_id) == {
            partitions.day_name("host_intervals", TODAY - 2): N // 2,
            partitions.day_name("host_intervals", TODAY - 1): N // 2,
        }
        again = client.post("/api/v1/ingest", json=body, headers=bearer(tokens.agent_a))
        assert again.status_code == 200 and again.json()["gpu_intervals"] == 0
        assert sum(_where(led, "gpu_intervals", run_id).values()) == N
        # An older ledger's strays (rows written before writes made their day) are still moved out.
        stray_day = TODAY - 20
        shift = (stray_day - (TODAY - 2)) * DAY_S
        for table in partitions.KEYS:
            cols = ", ".join(f'"{c}"' for c in led.read(lambda c, t=table: partitions._columns(c, t)))
            moved_cols = cols.replace('"t0"', f'"t0" + {shift}').replace('"seq"', '"seq" + 100000')
            sql = (f"INSERT INTO {partitions.default_name(table)} ({cols}) SELECT {moved_cols} FROM {table} "
                   f"WHERE run_id = :r AND seq = 0")  # fmt: skip
            led.write(lambda c, q=sql: c.execute(sa.text(q), {"r": run_id}))
        assert _defaults(led)["gpu_intervals"] == 1 and _defaults(led)["host_intervals"] == 1
        moved = partitions.maintain(led.database)
        assert moved.moved == 2  # the GPU's and the host's stray
        assert _where(led, "gpu_intervals", run_id) == {
            before: N // 2,
            yesterday: N // 2,
            partitions.day_name("gpu_intervals", stray_day): 1,
        }
        assert set(_defaults(led).values()) == {0}


def test_a_late_push_makes_its_day_first_and_no_row_is_deleted(pg_url: str, statements: list[str]) -> None:
    tokens = setup_accounts(pg_url)
    late = TODAY - 10
    body = _body(late * DAY_S + 3600)
    run_id = body["run"]["id"]
    with _client(pg_url) as client, Ledger(pg_url) as led:
        partitions.maintain(led.database)
        statements.clear()
        got = client.post("/api/v1/ingest", json=body, headers=bearer(tokens.agent_a))
        assert got.status_code == 200 and got.json()["gpu_intervals"] == N, got.text
        assert _where(led, "gpu_intervals", run_id) == {partitions.day_name("gpu_intervals", late): N}
        assert _where(led, "host_intervals", run_id) == {partitions.day_name("host_intervals", late): N}
        assert set(_defaults(led).values()) == {0}
        assert partitions.maintain(led.database).moved == 0
        assert set(_defaults(led).values()) == {0}
        assert [s for s in statements if DELETE_ROWS.search(s)] == []  # nothing moved, nothing deleted
        assert _made(statements, "gpu_intervals") == [late]  # once, by the write that needed it
        assert audit.verify(led, close_after_days=OPEN_DAYS).ok


def _made(statements: list[str], table: str) -> list[int]:
    """The days of ``table`` whose partition the captured statements made."""
    found = re.findall(rf"^CREATE TABLE {table}_p(\d{{8}}) \(LIKE", "\n".join(statements), re.M)
    return [calendar.timegm(time.strptime(d, "%Y%m%d")) // int(DAY_S) for d in found]


def test_the_local_recorder_makes_a_late_day_first_on_postgresql(pg_url: str, statements: list[str]) -> None:
    from test_store_records import full_gpu, full_run, run_id

    late = TODAY - 9
    run = full_run(run_id(3))
    with Ledger(pg_url) as led:  # a ledger gpuledger run records into (no server, no tokens)
        partitions.maintain(led.database)
        led.create_run(run)
        statements.clear()
        led.append(run.id, [full_gpu("GPU-a", i, t0=late * DAY_S + 60.0 * i) for i in range(3)])
        assert _made(statements, "gpu_intervals") == [late] and _made(statements, "host_intervals") == [late]
        assert [s for s in statements if DELETE_ROWS.search(s)] == []
        statements.clear()
        led.append(run.id, [full_gpu("GPU-a", 3, t0=late * DAY_S + 600.0)])
        assert [s for s in statements if "pg_inherits" in s or "pg_partitioned_table" in s] == []  # the day is known
        assert _where(led, "gpu_intervals", run.id) == {partitions.day_name("gpu_intervals", late): 4}
        assert set(_defaults(led).values()) == {0}


def test_a_day_another_process_dropped_is_made_again_once_what_this_one_knows_is_old(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a process knows of the day partitions is re-read after a while (retention in another
    process drops days): a row for a day dropped meanwhile then makes it again, not the default."""
    from test_store_records import full_gpu, full_run, run_id

    late = TODAY - 9
    run = full_run(run_id(4))
    day = partitions.day_name("gpu_intervals", late)
    with Ledger(pg_url) as led, Ledger(pg_url) as other:
        partitions.maintain(led.database)
        led.create_run(run)
        led.append(run.id, [full_gpu("GPU-a", 0, t0=late * DAY_S + 60.0)])
        other.write(lambda c: c.exec_driver_sql(f"DROP TABLE {day}"))  # as a retention elsewhere drops it
        monkeypatch.setattr(partition_days, "TTL_S", 0.0)  # what this process knows is old now
        led.append(run.id, [full_gpu("GPU-a", 1, t0=late * DAY_S + 120.0)])
        assert _where(led, "gpu_intervals", run.id) == {day: 1}
        assert set(_defaults(led).values()) == {0}


def test_two_replicas_pushing_the_same_late_day_at_once_both_succeed(pg_url: str) -> None:
    import threading

    tokens = setup_accounts(pg_url)
    late = TODAY - 12
    bodies = [_body(late * DAY_S + 3600), _body(late * DAY_S + 7200)]  # two runs, the same day
    start = threading.Barrier(2)
    answers: list[Any] = []

    def push(client: TestClient, order: list[dict[str, Any]]) -> None:
        start.wait(30)
        answers.extend(client.post("/api/v1/ingest", json=b, headers=bearer(tokens.agent_a)) for b in order)

    with _client(pg_url) as one, _client(pg_url) as two, Ledger(pg_url) as led:  # two servers, two processes' state
        pushers = [
            threading.Thread(target=push, args=(one, bodies)),
            threading.Thread(target=push, args=(two, bodies[::-1])),
        ]
        for t in pushers:
            t.start()
        for t in pushers:
            t.join(120)
        assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
        assert sorted(a.json()["gpu_intervals"] for a in answers) == [0, 0, N, N]  # each run's rows once
        for body in bodies:
            assert _where(led, "gpu_intervals", body["run"]["id"]) == {partitions.day_name("gpu_intervals", late): N}
        assert set(_defaults(led).values()) == {0}


def test_writers_racing_to_make_the_same_day_both_succeed(pg_url: str) -> None:
    import threading

    from gpuledger.store import partition_days

    day = TODAY - 40
    dbs = [Database(pg_url), Database(pg_url)]
    migrations.upgrade(dbs[0])
    start = threading.Barrier(2)
    failed: list[BaseException] = []

    def make(db: Database) -> None:
        start.wait(30)
        try:
            partition_days.make(db, {"gpu_capacity": {day}, "gpu_intervals": {day}})
        except BaseException as exc:
            failed.append(exc)

    try:
        racers = [threading.Thread(target=make, args=(db,)) for db in dbs]
        for t in racers:
            t.start()
        for t in racers:
            t.join(60)
        assert failed == []
        for table in partitions.SPECS:  # a GPU interval's day is made for the host intervals too
            assert day in dbs[1].read(lambda c, t=table: partitions.day_partitions(c, t))
    finally:
        for db in dbs:
            db.close()


def test_the_key_drops_an_interval_written_twice_through_the_ledger(pg_url: str) -> None:
    from test_store_records import full_gpu, full_run, run_id

    run = full_run(run_id(1))
    with Ledger(pg_url) as led:
        led.create_run(run)
        rows = [full_gpu("GPU-a", i) for i in range(3)]
        led.append(run.id, rows)
        led.append(run.id, rows)  # a retransmit: same run, device, seq and t0
        assert len(led.gpu_intervals(run.id)) == 3


def test_retention_drops_a_day_of_sealed_runs_and_keeps_a_day_a_running_run_holds(pg_url: str) -> None:
    tokens = setup_accounts(pg_url)
    done = _body((TODAY - 10) * DAY_S + 3600)  # ten days ago, finished and sealed
    running = _body((TODAY - 9) * DAY_S + 3600, final=False)  # nine days ago, still recording
    with _client(pg_url) as client, Ledger(pg_url) as led:
        for body in (done, running):
            assert client.post("/api/v1/ingest", json=body, headers=bearer(tokens.agent_a)).status_code == 200
        materialise_rollups(led)
        old = [partitions.day_name(t, TODAY - 10) for t in partitions.KEYS]
        held = [partitions.day_name(t, TODAY - 9) for t in partitions.KEYS]
        partitions.maintain(led.database)
        assert all(_exists(led, n) for n in old + held)
        gpu_before = led.read(lambda c: c.execute(sa.select(schema.gpu_rollups)).mappings().all())
        dropped_audit = audit.verify(led, close_after_days=OPEN_DAYS)
        assert dropped_audit.ok, dropped_audit.problems

        report = run_retention(
            led, Policy(raw_days=7, drop_partitions=True), actor="test", now=NOW, cost_rollups=materialise_rollups
        )
        assert report.days is not None
        assert report.days.dropped == [time.strftime("%Y-%m-%d", time.gmtime((TODAY - 10) * DAY_S))]
        assert report.days.rows == 2 * N
        kept = report.days.kept[time.strftime("%Y-%m-%d", time.gmtime((TODAY - 9) * DAY_S))]
        assert running["run"]["id"] in kept and "still recording" in kept
        assert not any(_exists(led, n) for n in old)  # gone from pg_class
        assert all(_exists(led, n) for n in held)
        assert led.gpu_intervals(done["run"]["id"]) == [] and led.host_intervals(done["run"]["id"]) == []
        assert len(led.gpu_intervals(running["run"]["id"])) == N
        # The cost rollups stay, as they were, and a stale mark or a rebuild cannot drop them now.
        assert led.read(lambda c: c.execute(sa.select(schema.gpu_rollups)).mappings().all()) == gpu_before
        led.write(lambda c: rollup_stale.drop_rollups(c, [done["run"]["id"]]))
        materialise_rollups(led, rebuild=True)
        assert led.read(lambda c: c.execute(sa.select(schema.gpu_rollups)).mappings().all()) == gpu_before
        verified = audit.verify(led, close_after_days=OPEN_DAYS)
        assert verified.ok, verified.problems
        # A late replay of the dropped day is dropped at ingest, not stored in the default partition.
        late = client.post("/api/v1/ingest", json=done, headers=bearer(tokens.agent_a))
        assert late.status_code == 200 and late.json()["gpu_intervals"] == 0
        assert led.gpu_intervals(done["run"]["id"]) == []


def _plain_layout(url: str) -> None:
    """Turn a migrated ledger's raw tables back into the layout before migration 18: the tables as
    schema.py defines them (created by SQLAlchemy, not by the code under test), the rows copied."""
    db = Database(url)
    meta = sa.MetaData()
    schema.runs.to_metadata(meta)
    plain = [schema.gpu_intervals.to_metadata(meta), schema.host_intervals.to_metadata(meta)]

    def tx(conn: sa.Connection) -> None:
        for table in plain:
            conn.exec_driver_sql(f"ALTER TABLE {table.name} RENAME TO {table.name}_part")
            conn.exec_driver_sql(f"ALTER TABLE {table.name}_part RENAME CONSTRAINT {table.name}_pkey TO x_{table.name}")
            table.create(conn)
            cols = ", ".join(f'"{c.name}"' for c in table.columns)
            conn.exec_driver_sql(f"INSERT INTO {table.name} ({cols}) SELECT {cols} FROM {table.name}_part")
            conn.exec_driver_sql(f"DROP TABLE {table.name}_part")
        conn.execute(sa.delete(schema.schema_version).where(schema.schema_version.c.version >= 18))  # 19 on: reapplied

    try:
        db.write(tx)
    finally:
        db.close()


def test_migration_18_partitions_a_populated_ledger_keeping_every_row(pg_url: str) -> None:
    tokens = setup_accounts(pg_url)
    with _client(pg_url) as client:
        for days_ago in (12, 11, 3):
            body = _body((TODAY - days_ago) * DAY_S - 200.0)  # across a midnight: two days each
            assert client.post("/api/v1/ingest", json=body, headers=bearer(tokens.agent_a)).status_code == 200
    _plain_layout(pg_url)

    def rows(led: Ledger) -> list[Any]:
        def q(c: sa.Connection) -> list[Any]:
            g = sorted(tuple(r) for r in c.execute(sa.select(schema.gpu_intervals)))
            return g + sorted(tuple(r) for r in c.execute(sa.select(schema.host_intervals)))

        return led.read(q)

    old = Database(pg_url)
    try:
        plain_rows = old.read(
            lambda c: (
                sorted(tuple(r) for r in c.execute(sa.select(schema.gpu_intervals)))
                + sorted(tuple(r) for r in c.execute(sa.select(schema.host_intervals)))
            )
        )
        plain_sums = old.read(
            lambda c: (
                *c.exec_driver_sql("SELECT count(*), sum(busy_s), sum(energy_j), sum(seq) FROM gpu_intervals").one(),
                *c.exec_driver_sql("SELECT count(*), sum(cpu_s), sum(read_b) FROM host_intervals").one(),
            )
        )
        assert old.read(migrations.current_version) < migrations.LATEST
        assert not old.read(lambda c: partitions.is_partitioned(c, "gpu_intervals"))
        assert migrations.upgrade(old) == migrations.LATEST
    finally:
        old.close()
    with Ledger(pg_url) as led:
        assert rows(led) == plain_rows and _sums(led) == plain_sums and plain_sums[0] == 3 * N
        for table in partitions.KEYS:
            assert led.read(lambda c, t=table: partitions.is_partitioned(c, t))
            days = set(led.read(lambda c, t=table: partitions.day_partitions(c, t)))
            assert days == {TODAY - 13, TODAY - 12, TODAY - 11, TODAY - 4, TODAY - 3}
            empty = led.read(lambda c, t=table: c.exec_driver_sql(f"SELECT count(*) FROM {t}_default").scalar())
            assert empty == 0
        verified = audit.verify(led, close_after_days=OPEN_DAYS)
        assert verified.ok, verified.problems


def test_retention_run_drop_partitions_keeps_the_bill_and_is_refused_on_sqlite(pg_url: str, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from gpuledger.cli.main import cli

    tokens = setup_accounts(pg_url)
    body = _body((TODAY - 10) * DAY_S + 3600)
    with _client(pg_url) as client:
        assert client.post("/api/v1/ingest", json=body, headers=bearer(tokens.agent_a)).status_code == 200
    env = {"GPULEDGER_RATES": "", "GPULEDGER_HOME": str(tmp_path / "home")}
    day = (TODAY - 10) * DAY_S

    def bill() -> dict[str, Any]:
        args = ["report", "chargeback", "--db", pg_url, "--from", _iso(day), "--to", _iso(day + DAY_S), "--json"]
        out = CliRunner().invoke(cli, args, env=env)
        assert out.exit_code == 0, out.output
        return json.loads(out.output)["total"]

    def run_cost() -> str:
        out = CliRunner().invoke(cli, ["cost", body["run"]["id"], "--db", pg_url, "--json"], env=env)
        assert out.exit_code == 0, out.output
        return json.loads(out.output)["total"]["cost"]

    before, cost = bill(), run_cost()
    assert float(before["cost"]) > 0 and float(cost) > 0
    args = ["retention", "run", "--db", pg_url, "--drop-partitions", "--keep-logs", "--keep-capacity"]
    out = CliRunner().invoke(cli, args, env=env)
    assert out.exit_code == 0, out.output
    assert f"raw intervals: 1 days dropped ({2 * N} rows)" in out.output
    with Ledger(pg_url) as led:
        assert led.gpu_intervals(body["run"]["id"]) == []
    assert bill() == before and run_cost() == cost
    sqlite = CliRunner().invoke(cli, ["db", "migrate", "--db", f"sqlite:///{tmp_path}/l.db"], env=env)
    assert sqlite.exit_code == 0, sqlite.output
    refused = CliRunner().invoke(cli, [*args[:3], f"sqlite:///{tmp_path}/l.db", *args[4:]], env=env)
    assert refused.exit_code == 1 and refused.output.startswith("Error: --drop-partitions is for PostgreSQL")


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def test_a_day_another_transaction_holds_is_kept_and_dropped_next_time(pg_url: str) -> None:
    import psycopg

    tokens = setup_accounts(pg_url)
    body = _body((TODAY - 10) * DAY_S + 3600)
    with _client(pg_url) as client:
        assert client.post("/api/v1/ingest", json=body, headers=bearer(tokens.agent_a)).status_code == 200
    name = partitions.day_name("gpu_intervals", TODAY - 10)
    date = time.strftime("%Y-%m-%d", time.gmtime((TODAY - 10) * DAY_S))
    policy = Policy(raw_days=7, drop_partitions=True)
    conninfo = sa.make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with Ledger(pg_url) as led, psycopg.connect(conninfo) as other:
        partitions.maintain(led.database)  # the day's rows out of the default partition, into their own
        other.execute(f"LOCK TABLE {name} IN ACCESS SHARE MODE")  # a long report reading that day
        held = run_retention(led, policy, actor="test", now=NOW, cost_rollups=materialise_rollups)
        assert held.days is not None and held.days.dropped == [] and "stayed locked" in held.days.kept[date]
        assert _exists(led, name) and len(led.gpu_intervals(body["run"]["id"])) == N
        other.rollback()
        freed = run_retention(led, policy, actor="test", now=NOW, cost_rollups=materialise_rollups)
        assert freed.days is not None and freed.days.dropped == [date] and not _exists(led, name)
        assert audit.verify(led, close_after_days=OPEN_DAYS).ok


def test_a_write_for_a_day_being_made_waits_for_it_and_lands_in_that_day(pg_url: str) -> None:
    import threading

    from test_store_records import full_gpu, full_run, run_id

    run = full_run(run_id(2))
    day = TODAY - 30
    with Ledger(pg_url) as led:
        led.create_run(run)
        conn = led.database.engine.connect()
        tx = conn.begin()
        partitions.ensure_partitions(conn, day * DAY_S, day * DAY_S)  # holds the default partition
        done: list[BaseException | None] = []

        def write() -> None:
            try:
                led.append(run.id, [full_gpu("GPU-a", 0, t0=day * DAY_S + 60.0)])
                done.append(None)
            except BaseException as exc:
                done.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        # the write waits to make its day (the maintainers' lock) or to write into the default partition
        waiting = (
            "SELECT count(*) FROM pg_locks WHERE NOT granted "
            "AND (locktype = 'advisory' OR relation = to_regclass('gpu_intervals_default'))"
        )
        deadline = time.monotonic() + 60
        while led.read(lambda c: c.exec_driver_sql(waiting).scalar()) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert led.read(lambda c: c.exec_driver_sql(waiting).scalar()) == 1  # the write waits for the attach
        tx.commit()
        conn.close()
        writer.join(60)
        assert done == [None]
        assert _where(led, "gpu_intervals", run.id) == {partitions.day_name("gpu_intervals", day): 1}


def test_a_failed_maintenance_pass_is_one_line_in_the_log(monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    """A lock held past the timeout fails the pass at start (the server serves on, rows land in the
    default partition): the log says so in one line, not SQLAlchemy's statement and link under it."""
    import asyncio
    from types import SimpleNamespace

    from gpuledger.server import app as server_app

    def locked(_db: object) -> None:
        orig = RuntimeError("canceling statement due to lock timeout\nLINE 1: SELECT DISTINCT floor(t0 / 86400) ...")
        raise sa.exc.OperationalError("SELECT DISTINCT floor(t0 / 86400) FROM gpu_intervals_default", {}, orig)

    monkeypatch.setattr(partitions, "maintain", locked)
    with caplog.at_level("WARNING", logger="gpuledger.server"):
        asyncio.run(server_app._maintain_partitions(SimpleNamespace(database=None)))  # type: ignore[arg-type]
    (record,) = caplog.records
    assert record.getMessage() == "partition maintenance failed: canceling statement due to lock timeout"
