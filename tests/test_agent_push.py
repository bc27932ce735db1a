"""``gpuledger agent --server``: discovered runs go through the outbox to a real server app (on
PostgreSQL) that is away when the agent starts and comes back; the run lands whole, ended once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpuledger.agent.client import Client
from gpuledger.core.model import DISCOVERED
from gpuledger.node.claims import Claims, ContainerClaim
from gpuledger.node.push import NodePusher
from gpuledger.server.app import create_app
from gpuledger.store import Ledger, pushes
from gpuledger.store.audit_verify import verify
from server_support import enroll, fresh_pg_url, setup_accounts
from test_agent_loop import CID, Node, exit_processes, make_trees
from test_agent_outbox import Flaky

SERVER = "http://testserver"


@pytest.fixture
def server() -> Iterator[tuple[TestClient, str, str]]:
    with fresh_pg_url() as url:
        setup_accounts(url)
        with TestClient(create_app(url)) as app_client:  # the node is enrolled: it pushes its capacity too
            yield app_client, url, enroll(url, "node-1")


def claims(finished: float | None = None) -> Claims:
    c = ContainerClaim(CID, name="trainer", labels={"team": "vision", "project": "A"}, finished_at=finished,
                       exit_code=0 if finished else None)  # fmt: skip
    return Claims(containers={CID: c})


def wait_pushed(local: str, pusher: NodePusher, done) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with Ledger(local) as led:
            states = [pushes.get(led, SERVER, r.id) for r in led.list_runs()]
        if states and all(s is not None and done(s) for s in states):
            return
        pusher.wrote([])
        time.sleep(0.1)
    raise AssertionError("the outbox did not drain")


def test_discovered_runs_reach_a_server_that_was_away(tmp_path: Path, server) -> None:  # type: ignore[no-untyped-def]
    trees = make_trees(tmp_path)
    app_client, server_url, token = server
    local = f"sqlite:///{tmp_path}/local.db"
    flaky = Flaky(app_client._transport, ["refuse"] * 3)  # the server is away for the first pushes
    lines: list[str] = []
    pusher = NodePusher(local, SERVER, token, warn=lines.append, period_s=0.1, backoff_min_s=0.05,
                        client=Client(SERVER, token, transport=flaky))  # fmt: skip
    pusher.start()
    node = Node(trees, local, claims(), t0=time.time() - 600, exit_at=40.0, pusher=pusher)
    node.tick(20)
    wait_pushed(local, pusher, lambda state: state.gpu_next)  # the open run is on the server
    with Ledger(server_url) as remote:
        [open_run] = remote.list_runs()
        assert open_run.status == DISCOVERED and open_run.ended_at is None
        check = verify(remote)  # an open discovered run is recording, not "never sealed"
        assert check.unsealed_running == 1 and not [p for p in check.problems if open_run.id in p]
    node.source.now = claims(finished=node.clock.t)
    exit_processes(trees / "proc", 300, 301)
    node.tick()
    node.stop()
    with Ledger(local) as led:
        [run] = led.list_runs()
        want = (len(led.gpu_intervals(run.id)), len(led.host_intervals(run.id)))
    wait_pushed(local, pusher, lambda state: state.done)
    pusher.close()
    assert any("cannot push" in ln for ln in lines) and any("again" in ln for ln in lines)
    with Ledger(server_url) as remote:
        got = remote.get_run(run.id)
        assert (got.status, got.exit_code, got.ended_at, got.labels["team"]) == (DISCOVERED, 0, run.ended_at, "vision")
        assert (len(remote.gpu_intervals(run.id)), len(remote.host_intervals(run.id))) == want
        check = verify(remote)  # ended by its final push: sealed, like any finished run
        assert check.unsealed_running == 0 and not [p for p in check.problems if run.id in p], check.problems
