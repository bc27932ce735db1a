"""Retention of the capacity ledger (store/capacity_retention.py), on SQLite and PostgreSQL: the raw
intervals of days before the cut go, every day sum stays exactly what it was, and an interval a
team server has not acknowledged is never deleted (an agent's outbox loses nothing).

PostgreSQL drops whole day partitions (store/capacity_days_drop.py), so what goes is a day's worth:
a day goes only when every interval of it may (``_gone``): one crossing the cut, or one a server
lacks, keeps its whole day until a later pass."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from gpuledger.agent.client import Client, Unreachable
from gpuledger.agent.sync import sync
from gpuledger.cli.main import cli
from gpuledger.core.capacity.model import DAY_MS, CapacityInterval, States
from gpuledger.store import Ledger, audit, schema
from gpuledger.store.capacity import rebuild_days, write_capacity
from gpuledger.store.capacity_push import acknowledge, outbox, register
from gpuledger.store.capacity_queries import day_rows, intervals
from gpuledger.store.retention import DAY_S, Policy, run_retention
from server_support import free_port

DAY0 = 20_500  # 2026-02-16 UTC
STEP = 3 * 3600 * 1000  # 3-hour intervals, offset so some cross midnight
GPUS = {"GPU-1": "node-a", "GPU-2": "node-a", "GPU-3": "node-b"}
Key = tuple[str, int]


def _fleet_days(days: int = 4) -> list[CapacityInterval]:
    out = []
    for gpu, host in GPUS.items():
        t = DAY0 * DAY_MS + 3_600_000  # 01:00 on day 0
        while t + STEP <= (DAY0 + days) * DAY_MS:
            busy = (t // STEP) % 4 * 900_000
            out.append(CapacityInterval(gpu, host, t, t + STEP, States(STEP - busy, 0, busy, 0), 0, 12.5))
            t += STEP
    return out


def _gone(url: str, ivs: list[CapacityInterval], cut: int, ok: Callable[[CapacityInterval], bool]) -> set[Key]:
    """The intervals retention removes at ``cut``, of those ``ok`` (acknowledged): on SQLite each one
    that ends by the cut; on PostgreSQL the whole days before it none of whose intervals stays."""
    may = {(iv.gpu_uuid, iv.t0_ms) for iv in ivs if iv.t1_ms <= cut and ok(iv)}
    if not url.startswith("postgresql"):
        return may
    by_day: dict[int, set[Key]] = {}
    for iv in ivs:
        by_day.setdefault(iv.t0_ms // DAY_MS, set()).add((iv.gpu_uuid, iv.t0_ms))
    return {k for day, keys in by_day.items() if (day + 1) * DAY_MS <= cut and keys <= may for k in keys}


def _now_cutting_at(day: int) -> float:
    """A retention time whose 1-day policy cuts at the midnight that starts ``day``."""
    return (day * DAY_MS + DAY_MS // 2) / 1000 + DAY_S


def test_the_raw_intervals_before_the_cut_go_and_the_day_sums_stay(ledger_url: str) -> None:
    ivs = _fleet_days()
    cut = (DAY0 + 2) * DAY_MS
    with Ledger(ledger_url) as led:
        led.write(lambda c: write_capacity(led.database, c, ivs))
        days_before = sorted(led.read(lambda c: day_rows(c, 0, 10**6)))
        report = run_retention(led, Policy(raw_days=30, capacity_days=1), actor="test", now=_now_cutting_at(DAY0 + 2))

        assert report.capacity is not None and report.capacity.cut_ms == cut
        ended_by_cut = _gone(ledger_url, ivs, cut, lambda iv: True)
        assert report.capacity.rows == len(ended_by_cut) > 0 and report.capacity.kept_unpushed == 0
        left = {(r["gpu_uuid"], r["t0_ms"]) for r in led.read(lambda c: intervals(c))}
        assert left == {(iv.gpu_uuid, iv.t0_ms) for iv in ivs} - ended_by_cut  # one crossing the cut stays
        assert sorted(led.read(lambda c: day_rows(c, 0, 10**6))) == days_before  # what every report reads
        assert led.write(lambda c: rebuild_days(led.database, c, from_day=DAY0 + 2)) > 0
        assert sorted(led.read(lambda c: day_rows(c, 0, 10**6))) == days_before  # the kept days still add up
        log = schema.audit_log.c
        q = sa.select(log.payload).where(log.action == "retention.run").order_by(log.seq.desc())
        assert json.loads(led.read(lambda c: c.scalar(q)))["capacity"]["rows"] == len(ended_by_cut)
        assert audit.verify(led).ok
        again = run_retention(led, Policy(raw_days=30, capacity_days=1), actor="test", now=_now_cutting_at(DAY0 + 2))
        assert again.capacity is not None and again.capacity.rows == 0


def test_an_interval_a_server_has_not_acknowledged_is_kept(ledger_url: str) -> None:
    ivs = _fleet_days()
    cut = (DAY0 + 3) * DAY_MS
    half = (DAY0 + 1) * DAY_MS + 4 * 3_600_000  # server B has GPU-2 only up to day 1, 04:00
    with Ledger(ledger_url) as led:
        led.write(lambda c: write_capacity(led.database, c, ivs))
        everything = (DAY0 + 10) * DAY_MS
        acknowledge(led, "https://a", dict.fromkeys(GPUS, everything))  # A has it all
        acknowledge(led, "https://b", {"GPU-1": everything, "GPU-2": half})  # B: GPU-3 never
        report = run_retention(led, Policy(raw_days=30, capacity_days=1), actor="test", now=_now_cutting_at(DAY0 + 3))

        def pushed_everywhere(iv: CapacityInterval) -> bool:
            return iv.gpu_uuid == "GPU-1" or (iv.gpu_uuid == "GPU-2" and iv.t0_ms < half)

        gone = _gone(ledger_url, ivs, cut, pushed_everywhere)
        left = {(r["gpu_uuid"], r["t0_ms"]) for r in led.read(lambda c: intervals(c))}
        assert left == {(iv.gpu_uuid, iv.t0_ms) for iv in ivs} - gone
        assert report.capacity is not None and report.capacity.rows == len(gone)
        unpushed = sum(1 for iv in ivs if iv.t1_ms <= cut and not pushed_everywhere(iv))
        assert report.capacity.kept_unpushed == unpushed > 0


def test_a_server_that_was_never_reached_keeps_what_it_lacks(ledger_url: str) -> None:
    # An agent pushing to a server that has been down since its first push: nothing was ever
    # acknowledged, yet every interval is the server's to get, so retention deletes none of them.
    ivs = _fleet_days()
    with Ledger(ledger_url) as led:
        led.write(lambda c: write_capacity(led.database, c, ivs))
        with Client(f"http://127.0.0.1:{free_port()}", "glt_test", timeout_s=2) as dead, pytest.raises(Unreachable):
            sync(led, dead)
        report = run_retention(led, Policy(raw_days=30, capacity_days=1), actor="test", now=_now_cutting_at(DAY0 + 3))
        assert report.capacity is not None and report.capacity.rows == 0
        assert report.capacity.kept_unpushed == sum(1 for iv in ivs if iv.t1_ms <= (DAY0 + 3) * DAY_MS) > 0
        assert len(led.read(lambda c: intervals(c))) == len(ivs)


def test_retention_run_says_what_it_deleted_and_keep_capacity_keeps_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path}/team.db"
    ivs = _fleet_days()
    with Ledger(url) as led:
        led.write(lambda c: write_capacity(led.database, c, ivs))
    runner = CliRunner()
    kept = runner.invoke(cli, ["retention", "run", "--db", url, "--keep-capacity"])
    assert kept.exit_code == 0, kept.output
    with Ledger(url) as led:
        assert len(led.read(lambda c: intervals(c))) == len(ivs)
    done = runner.invoke(cli, ["retention", "run", "--db", url, "--capacity-days", "1"])
    assert done.exit_code == 0, done.output
    assert f"capacity: {len(ivs)} raw intervals before" in done.output and "(day sums kept)" in done.output
    with Ledger(url) as led:
        assert led.read(lambda c: c.scalar(sa.text("SELECT count(*) FROM gpu_capacity"))) == 0
        assert led.read(lambda c: c.scalar(sa.text("SELECT count(*) FROM gpu_capacity_days"))) > 0


def test_a_forgotten_server_no_longer_holds_back_retention(ledger_url: str) -> None:
    # An agent once pushed to a server that is gone for good: until it is forgotten, retention keeps
    # every interval that server lacks, forever. `sync --forget` drops its outbox, audited.
    gone, kept = "http://gone.example:8080", "http://kept.example:8080"
    ivs = _fleet_days()
    with Ledger(ledger_url) as led:
        led.write(lambda c: write_capacity(led.database, c, ivs))
        register(led, gone)
        acknowledge(led, kept, {gpu: (DAY0 + 10) * DAY_MS for gpu in GPUS})  # has everything
        boxes = {b.server: b for b in outbox(led)}
        assert boxes[gone].unacknowledged == len(ivs) and boxes[gone].last_acknowledged_at is None
        assert boxes[gone].oldest_t0_ms == min(iv.t0_ms for iv in ivs)
        assert boxes[kept].unacknowledged == 0 and boxes[kept].gpus_acknowledged == len(GPUS)

    runner = CliRunner()
    status = runner.invoke(cli, ["sync", "--server", gone, "--status", "--db", ledger_url])
    assert status.exit_code == 0, status.output
    assert f"capacity  {len(ivs)} intervals pending" in status.output and "never acknowledged" in status.output
    declined = runner.invoke(cli, ["sync", "--server", gone, "--forget", "--db", ledger_url], input="n\n")
    assert declined.exit_code != 0 and "Forget it" in declined.output
    with Ledger(ledger_url) as led:
        assert {b.server for b in outbox(led)} == {gone, kept}  # asked, declined: nothing changed

    forgot = runner.invoke(cli, ["sync", "--server", gone, "--forget", "--db", ledger_url], input="y\n")
    assert forgot.exit_code == 0, forgot.output
    assert f"forgot {gone}" in forgot.output
    with Ledger(ledger_url) as led:
        assert [b.server for b in outbox(led)] == [kept]
        report = run_retention(led, Policy(raw_days=30, capacity_days=1), actor="test", now=_now_cutting_at(DAY0 + 3))
        assert report.capacity is not None and report.capacity.kept_unpushed == 0
        assert report.capacity.rows == len(_gone(ledger_url, ivs, (DAY0 + 3) * DAY_MS, lambda iv: True)) > 0
        log = schema.audit_log.c
        q = sa.select(log.object, log.payload).where(log.action == "capacity.forget_server")
        obj, payload = led.read(lambda c: c.execute(q).one())
        assert obj == gone and json.loads(payload)["unacknowledged"] == len(ivs)
        assert audit.verify(led).ok

    again = runner.invoke(cli, ["sync", "--server", gone, "--forget", "--yes", "--db", ledger_url])
    assert again.exit_code != 0 and "does not push capacity to" in again.output


def test_intervals_sent_again_after_retention_are_not_counted_twice(ledger_url: str) -> None:
    # Retention deleted the raw rows, the only duplicate key; the day sums still hold them. A batch
    # sent again (a restored agent, a re-sync after --forget) must not add them a second time.
    ivs = _fleet_days()
    with Ledger(ledger_url) as led:
        assert led.write(lambda c: write_capacity(led.database, c, ivs)) == len(ivs)
        days_before = sorted(led.read(lambda c: day_rows(c, 0, 10**6)))
        run_retention(led, Policy(raw_days=30, capacity_days=1), actor="test", now=_now_cutting_at(DAY0 + 2))
        kept = {(r["gpu_uuid"], r["t0_ms"]) for r in led.read(lambda c: intervals(c))}
        assert len(kept) < len(ivs)
        assert led.write(lambda c: write_capacity(led.database, c, ivs)) == 0
        assert sorted(led.read(lambda c: day_rows(c, 0, 10**6))) == days_before
        t = (DAY0 + 5) * DAY_MS
        later = CapacityInterval("GPU-1", "node-a", t, t + STEP, States(STEP, 0, 0, 0))
        assert led.write(lambda c: write_capacity(led.database, c, [later])) == 1  # new time still counts
