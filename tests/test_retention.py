"""Retention: raw intervals rolled up to 1-minute then 1-hour intervals with the same totals, the
same per-epoch figures and a valid audit trail; replays of rolled-up raw rows are dropped."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient

from gpuledger.core.metering.rollup import groups, rollup_gpu
from gpuledger.core.model import GpuInterval
from gpuledger.reports.run import epochs as epochs_report
from gpuledger.runs.view import summary
from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, audit
from gpuledger.store.retention import DAY_S, Policy, run_retention
from server_support import NOW, bearer, devices_doc, gpu_rows, host_rows, run_doc, setup_accounts

START = NOW - 10 * DAY_S  # ended 10 days ago: past the 7 days of raw intervals
OPEN_DAYS = 62  # pushed now, ten days late: no month may have closed (store/closed_months.py)
N = 400  # 5 s intervals: 2000 s, about 34 minutes


@dataclass
class World:
    url: str
    client: TestClient
    agent: str
    run_id: str
    body: dict


def _body(run_id: str | None = None) -> dict:
    doc = run_doc(run_id=run_id, started_at=START, status="succeeded", ended_at=START + N * 5.0, exit_code=0)
    events = []
    for epoch, (a, b) in enumerate(((100, 900), (905, 1700)), start=1):  # boundaries on interval edges
        events.append({"seq": len(events), "t": START + a, "kind": "epoch_start", "payload": {"epoch": epoch}})
        events.append(
            {"seq": len(events), "t": START + b, "kind": "epoch_end", "payload": {"epoch": epoch, "images": 1000}}
        )
    return {
        "run": doc,
        "devices": devices_doc(2),
        "gpu_intervals": gpu_rows(N, devices=2, start=START),
        "host_intervals": host_rows(N, start=START),
        "events": events,
        "metrics": [{"seq": 0, "t": START + 900, "key": "loss", "value": 0.3, "epoch": 1}],
        "final": True,
    }


@pytest.fixture
def world(ledger_url: str) -> Iterator[World]:
    tokens = setup_accounts(ledger_url)
    with TestClient(create_app(ledger_url, settings=Settings(close_after_days=OPEN_DAYS))) as client:
        body = _body()
        assert client.post("/api/v1/ingest", json=body, headers=bearer(tokens.agent_a)).status_code == 200
        client.put(f"/api/v1/runs/{body['run']['id']}/log", content=b"log\n", headers=bearer(tokens.agent_a))
        yield World(ledger_url, client, tokens.agent_a, body["run"]["id"], body)


def _figures(led: Ledger, run_id: str) -> dict:
    """The run's whole summary (as ``gpuledger show --json``) but the interval counts, its
    per-epoch figures and the SQL totals."""
    run = led.get_run(run_id)
    s = summary(led, run, now=NOW)
    s.pop("intervals")
    for g in s["gpus"]:
        g.pop("intervals")
    epochs = [
        {k: r[k] for k in ("phase", "epoch", "gpu_busy_s", "gpu_energy_j", "cpu_s", "wall_s", "exact")}
        for r in epochs_report.epoch_table(led, run)
    ]
    return {
        "summary": s,
        "gpu_totals": led.gpu_totals(run_id),
        "host_totals": {k: v for k, v in led.host_totals(run_id).items() if k != "count"},
        "epochs": epochs,
    }


def _close(a: object, b: object, path: str = "") -> None:
    if isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-9), (path, a, b)
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    else:
        assert a == b, (path, a, b)


def _without_counts(figures: dict) -> dict:
    out = dict(figures)
    out["gpu_totals"] = {
        u: {k: v for k, v in t.items() if k not in ("count", "busy_count", "energy_count")}
        for u, t in figures["gpu_totals"].items()
    }
    return out


def test_rollups_keep_totals_epochs_and_the_audit_trail(world: World) -> None:
    with Ledger(world.url) as led:
        before = _figures(led, world.run_id)
        report = run_retention(led, Policy(raw_days=7, minute_days=90), actor="test", now=NOW)
        assert report.rolled_up == {60: 1} and not report.skipped
        assert report.rows_before == 3 * N and report.rows_after < report.rows_before / 8
        minute = _figures(led, world.run_id)
        _close(_without_counts(before), _without_counts(minute))
        assert all(iv.t1 - iv.t0 <= 60.0 for iv in led.gpu_intervals(world.run_id))
        assert audit.verify(led, close_after_days=OPEN_DAYS).ok, audit.verify(led, close_after_days=OPEN_DAYS).problems

        # a late replay of the raw batch (an agent's outbox) is dropped, not added twice
        again = world.client.post("/api/v1/ingest", json=world.body, headers=bearer(world.agent)).json()
        assert again["dropped_rolled_up"] == 3 * N and again["gpu_intervals"] == 0
        _close(_without_counts(minute), _without_counts(_figures(led, world.run_id)))

        report = run_retention(led, Policy(raw_days=7, minute_days=9), actor="test", now=NOW)
        assert report.rolled_up == {3600: 1}
        hour = _figures(led, world.run_id)
        _close(_without_counts(before), _without_counts(hour))
        assert audit.verify(led, close_after_days=OPEN_DAYS).ok, audit.verify(led, close_after_days=OPEN_DAYS).problems
        assert run_retention(led, Policy(), actor="test", now=NOW).rolled_up == {}  # idempotent


def test_logs_and_runs_go_by_their_own_policy(world: World) -> None:
    with Ledger(world.url) as led:
        run_retention(led, Policy(raw_days=30, log_days=None), actor="test", now=NOW)
        assert led.get_log(world.run_id) == b"log\n"
        report = run_retention(led, Policy(raw_days=30, log_days=5), actor="test", now=NOW)
        assert report.logs_deleted == 1 and led.get_log(world.run_id) is None
        assert audit.verify(led, close_after_days=OPEN_DAYS).ok
        report = run_retention(led, Policy(raw_days=30, log_days=5, run_days=9), actor="test", now=NOW)
        assert report.runs_deleted == 1 and led.list_runs() == []
        result = audit.verify(led, close_after_days=OPEN_DAYS)
        assert result.ok, result.problems


def test_a_tampered_run_is_not_laundered_by_retention(world: World) -> None:
    import sqlalchemy as sa

    with Ledger(world.url) as led:
        with led.database.engine.begin() as conn:
            conn.execute(sa.text("UPDATE gpu_intervals SET busy_s = 0 WHERE seq = 3"))
        report = run_retention(led, Policy(), actor="test", now=NOW)
        assert world.run_id in report.skipped and report.rolled_up == {}
        assert any("row seq 3 edited" in p for p in audit.verify(led, close_after_days=OPEN_DAYS).problems)


def test_groups_break_at_gaps_buckets_and_cuts() -> None:
    ivs = [GpuInterval("g", i, 1000.0 + 5 * i, 1005.0 + 5 * i, busy_s=1.0) for i in range(30)]
    ivs += [GpuInterval("g", 30, 1200.0, 1205.0, busy_s=1.0)]  # after a 45 s hole
    gs = groups(ivs, 60, cuts=[1030.0])
    # minute [960, 1020) | cut at 1030 | [1030, 1080) | [1080, 1140) | [1140, 1150) | after the hole
    assert [len(g) for g in gs] == [4, 2, 10, 12, 2, 1]
    merged = rollup_gpu(ivs, 60, cuts=[1030.0])
    assert math.fsum(m.busy_s or 0 for m in merged) == 31.0 and [m.seq for m in merged] == [0, 4, 6, 16, 28, 30]
