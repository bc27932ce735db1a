"""A run whose agent stopped pushing becomes ``lost`` on the server after a silence, instead of
``running`` forever; when its agent speaks again the verdict is undone, and the agent may still
report the real end."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, audit, liveness_sweep
from server_support import Tokens, batch, bearer, fresh_pg_url, gpu_rows, host_rows, run_doc, setup_accounts

HOUR = 3600.0


@pytest.fixture
def api() -> Iterator[tuple[TestClient, str, Tokens]]:
    with fresh_pg_url() as url:
        tokens = setup_accounts(url)
        with TestClient(create_app(url, settings=Settings(lost_after_s=0))) as client:  # sweeps by hand here
            yield client, url, tokens


def _actions(url: str, run_id: str) -> list[tuple[str, str]]:
    log = audit.T.audit_log.c
    q = sa.select(log.action, log.actor).where(log.object == f"run:{run_id}").order_by(log.seq)
    with Ledger(url) as led:
        return [(a, b) for a, b in led.read(lambda c: list(c.execute(q)))]


def test_a_silent_run_is_lost_then_back_when_its_agent_speaks(api) -> None:  # type: ignore[no-untyped-def]
    client, url, t = api
    silent, chatty = run_doc(), run_doc()
    for run in (silent, chatty):
        assert client.post("/api/v1/ingest", json=batch(run, n=5), headers=bearer(t.agent_a)).status_code == 200
    pushed_at = time.time()
    with Ledger(url) as led:
        # half an hour on, nothing is lost yet; two hours on, both are (one sweep would do it on any replica)
        assert liveness_sweep.sweep(led.database, lost_after_s=HOUR, now=pushed_at + HOUR / 2) == []
        marked = liveness_sweep.sweep(led.database, lost_after_s=HOUR, now=pushed_at + 2 * HOUR)
        assert sorted(marked) == sorted([silent["id"], chatty["id"]])
        assert liveness_sweep.sweep(led.database, lost_after_s=HOUR, now=pushed_at + 3 * HOUR) == []  # once
        lost = led.get_run(silent["id"])
    assert lost.status == "lost" and lost.status_reason.startswith(liveness_sweep.REASON_PREFIX)
    assert pushed_at - 60 < lost.ended_at <= pushed_at + 1  # ended at its last sign of life: the last push
    assert ("run.ended", liveness_sweep.ACTOR) in _actions(url, silent["id"])
    listed = client.get("/api/v1/runs", params={"status": "running"}, headers=bearer(t.member_a)).json()
    assert listed == []

    # the chatty run's agent was only cut off: it pushes on, as running, and the run is running again
    more = {"run": chatty, "gpu_intervals": gpu_rows(3, first_seq=5), "host_intervals": host_rows(3, first_seq=5)}
    got = client.post("/api/v1/ingest", json=more, headers=bearer(t.agent_a))
    assert got.status_code == 200 and got.json()["gpu_intervals"] == 3
    back = client.get(f"/api/v1/runs/{chatty['id']}", headers=bearer(t.member_a)).json()
    assert back["status"] == "running" and back["ended_at"] is None
    assert [a for a, _ in _actions(url, chatty["id"])][-2:] == ["run.ended", "run.revived"]
    ended = chatty | {"status": "succeeded", "ended_at": time.time() - 1, "exit_code": 0}
    assert client.post("/api/v1/ingest", json={"run": ended, "final": True}, headers=bearer(t.agent_a)).json()["sealed"]
    assert client.get(f"/api/v1/runs/{chatty['id']}", headers=bearer(t.admin)).json()["status"] == "succeeded"

    # the silent one's agent reports, late, how the run really ended: the verdict gives way
    real_end = silent | {"status": "failed", "ended_at": pushed_at - 5, "exit_code": 1}
    assert (
        client.post("/api/v1/ingest", json={"run": real_end, "final": True}, headers=bearer(t.agent_a)).status_code
        == 200
    )
    assert client.get(f"/api/v1/runs/{silent['id']}", headers=bearer(t.admin)).json()["status"] == "failed"
    with Ledger(url) as led:
        assert audit.verify(led).ok


def test_the_server_sweeps_by_itself(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with fresh_pg_url() as url:
        tokens = setup_accounts(url)
        settings = Settings(lost_after_s=1, sweep_every_s=0.1, sweep_delay_s=0)
        with TestClient(create_app(url, settings=settings)) as client:
            run = run_doc()
            assert (
                client.post("/api/v1/ingest", json=batch(run, n=2), headers=bearer(tokens.agent_a)).status_code == 200
            )
            deadline = time.monotonic() + 60
            status = "running"
            while status == "running" and time.monotonic() < deadline:  # waits for the sweep, asserts no timing
                time.sleep(0.2)
                status = client.get(f"/api/v1/runs/{run['id']}", headers=bearer(tokens.admin)).json()["status"]
            assert status == "lost"
