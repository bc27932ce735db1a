"""A node's capacity intervals reach the team server through the local ledger's outbox: a real server
app on PostgreSQL, the agent's real loop (tests/test_agent_loop.py's Node) with its NodePusher; a
replayed batch stores nothing twice, a bad batch is refused whole with a clear 422, and an older
server without the route leaves the rows in the outbox while runs are pushed as before."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from gpuledger.agent.capacity_push import push_capacity
from gpuledger.agent.client import Client
from gpuledger.agent.sync import sync
from gpuledger.core.capacity.model import CapacityInterval, Sighting, States
from gpuledger.node.push import NodePusher
from gpuledger.server.app import create_app
from gpuledger.store import Ledger, ownership
from gpuledger.store.capacity import write_capacity
from gpuledger.store.capacity_queries import day_rows, fleet, intervals
from server_support import bearer, enroll, fresh_pg_url, setup_accounts
from test_agent_loop import Node, make_trees
from test_agent_push import claims
from test_capacity_agent import STATES

SERVER = "http://testserver"
T0_MS = (int(time.time()) - 2 * 86400) * 1000  # two days ago: the server refuses times in the future


@pytest.fixture
def server() -> Iterator[tuple[TestClient, str, str, str]]:
    with fresh_pg_url() as url:
        tokens = setup_accounts(url)
        with TestClient(create_app(url)) as app_client:  # node-1 is enrolled: it pushes its own capacity
            yield app_client, url, enroll(url, "node-1"), tokens.member_a


def test_the_agents_capacity_reaches_the_server_whole(tmp_path: Path, server) -> None:  # type: ignore[no-untyped-def]
    app_client, server_url, token, _ = server
    local = f"sqlite:///{tmp_path}/local.db"
    lines: list[str] = []
    pusher = NodePusher(local, SERVER, token, warn=lines.append, period_s=0.1,
                        client=Client(SERVER, token, transport=app_client._transport))  # fmt: skip
    pusher.start()
    node = Node(make_trees(tmp_path), local, claims(), t0=time.time() - 600, pusher=pusher)
    node.tick(15)
    node.stop()
    with Ledger(local) as led:
        want = sorted((r["gpu_uuid"], r["t0_ms"], *(r[s] for s in STATES)) for r in led.read(lambda c: intervals(c)))
    deadline = time.monotonic() + 60
    while True:
        with Ledger(server_url) as remote:
            got = sorted((r["gpu_uuid"], r["t0_ms"], *(r[s] for s in STATES)) for r in remote.read(intervals))
        if got == want or time.monotonic() > deadline:
            break
        pusher.wrote([])
        time.sleep(0.1)
    pusher.close()
    assert got == want and len({w[0] for w in want}) == 2 and len(want) >= 6  # both GPUs, every interval
    with Ledger(server_url) as remote:
        assert {g.uuid for g in remote.read(lambda c: fleet(c))} == {w[0] for w in want}
        assert sum(sum(r[5:9]) for r in remote.read(lambda c: day_rows(c, 0, 10**6))) == sum(sum(w[2:]) for w in want)
    assert not [ln for ln in lines if "cannot push" in ln]


def _local_rows(url: str, n: int) -> None:
    ivs = [CapacityInterval("GPU-x", "node-1", T0_MS + k * 10_000, T0_MS + (k + 1) * 10_000, States(0, 4000, 6000, 0))
           for k in range(n)]  # fmt: skip
    sight = Sighting("GPU-x", "NVIDIA L4", "node-1", T0_MS / 1000, (T0_MS + n * 10_000) / 1000)
    with Ledger(url) as led:
        led.write(lambda c: write_capacity(led.database, c, ivs, [sight]))


def test_sync_pushes_in_batches_and_a_replay_stores_nothing_twice(tmp_path: Path, server) -> None:  # type: ignore[no-untyped-def]
    app_client, server_url, token, _ = server
    local = f"sqlite:///{tmp_path}/local.db"
    _local_rows(local, 25)
    client = Client(SERVER, token, transport=app_client._transport)
    with Ledger(local) as led:
        first = push_capacity(led, client, budget=10)
        assert (first.rows, first.batches) == (25, 3)
        assert push_capacity(led, client).rows == 0  # acknowledged: nothing left
        led.write(lambda c: c.exec_driver_sql("DELETE FROM capacity_pushes"))  # watermarks lost: all again
        report = sync(led, client)
        assert report.capacity_rows == 25
    with Ledger(server_url) as remote:
        rows = remote.read(lambda c: intervals(c))
        days = remote.read(lambda c: day_rows(c, 0, 10**6))
    assert len(rows) == 25 and sum(r[7] for r in days) == 25 * 6000  # the day sums counted each row once


def test_a_bad_batch_is_refused_whole_with_a_reason(server) -> None:  # type: ignore[no-untyped-def]
    app_client, server_url, token, member = server
    good = ["GPU-x", "node-1", T0_MS, T0_MS + 1000, 1000, 0, 0, 0, 0, None]
    bad = ["GPU-x", "node-1", T0_MS + 1000, T0_MS + 2000, 500, 0, 0, 0, 0, None]  # states: 500 of 1000 ms
    answer = app_client.post("/api/v1/capacity", json={"intervals": [good, bad]}, headers=bearer(token))
    assert answer.status_code == 422 and "intervals[1]" in answer.text and "add up" in answer.text
    # 10^20 J in one second: no GPU draws that; accepted, it would overflow the report's sums
    absurd = ["GPU-x", "node-1", T0_MS + 1000, T0_MS + 2000, 1000, 0, 0, 0, 0, 1e20]
    answer = app_client.post("/api/v1/capacity", json={"intervals": [good, absurd]}, headers=bearer(token))
    assert answer.status_code == 422 and "intervals[1]" in answer.text and "more than any GPU draws" in answer.text
    # a sighting ten years ahead would stay the GPU's last sighting and price future months as unobserved
    ahead = {"uuid": "GPU-x", "name": "NVIDIA L4", "host": "node-1", "first_seen": T0_MS / 1000,
             "last_seen": T0_MS / 1000 + 10 * 365 * 86400}  # fmt: skip
    answer = app_client.post("/api/v1/capacity", json={"intervals": [good], "gpus": [ahead]}, headers=bearer(token))
    assert answer.status_code == 422 and "gpus[0]: last_seen is in the future" in answer.text
    refused = app_client.post("/api/v1/capacity", json={"intervals": [good]}, headers=bearer(member))
    assert refused.status_code == 403  # a member (reader) cannot write
    assert app_client.post("/api/v1/capacity", json={"intervals": [good]}).status_code == 401
    with Ledger(server_url) as remote:
        assert remote.read(lambda c: intervals(c)) == []
    seen = ahead | {"last_seen": T0_MS / 1000 + 1}
    ok = app_client.post("/api/v1/capacity", json={"intervals": [good], "gpus": [seen]}, headers=bearer(token))
    assert ok.status_code == 200 and ok.json() == {"received": 1, "stored": 1, "quarantined": []}


def test_a_server_without_the_capacity_route_keeps_the_rows_in_the_outbox(tmp_path: Path) -> None:
    local = f"sqlite:///{tmp_path}/local.db"
    _local_rows(local, 3)

    def older_server(request: httpx.Request) -> httpx.Response:  # answers as FastAPI does for an unknown path
        return httpx.Response(404, json={"detail": "Not Found"})

    client = Client(SERVER, "t", transport=httpx.MockTransport(older_server))
    with Ledger(local) as led:
        pushed = push_capacity(led, client)
        assert pushed.unsupported and pushed.rows == 0
        assert push_capacity(led, client).unsupported  # still there, to push once the server is upgraded


def test_a_gpu_moved_off_a_cloud_instance_reaches_the_server_with_each_hosts_instance_type(
    tmp_path: Path, server
) -> None:  # type: ignore[no-untyped-def]
    # The GPU on a p4d (its agent named the instance), then on an on-prem node (no instance type):
    # the server must price the on-prem stay by the model. Each node pushes with its own enrolled
    # token, and the move is an admin's re-home (the GPU is the p4d's until then).
    app_client, server_url, _, _ = server
    hour = 3_600_000
    stays = [("p4d-01", T0_MS, "p4d.24xlarge"), ("onprem-01", T0_MS + 2 * hour, None)]
    for host, t0, instance in stays:
        local = f"sqlite:///{tmp_path}/{host}.db"
        with Ledger(local) as led:
            iv = CapacityInterval("GPU-m", host, t0, t0 + hour, States(hour, 0, 0, 0))
            sight = Sighting("GPU-m", "NVIDIA A100-SXM4-40GB", host, t0 / 1000, (t0 + hour) / 1000, instance)
            led.write(lambda c, iv=iv, sight=sight: write_capacity(led.database, c, [iv], [sight]))
            token = enroll(server_url, host)
            if host == "onprem-01":
                with Ledger(server_url) as remote:
                    ownership.rehome(remote, "GPU-m", host, None, actor="admin")
            assert push_capacity(led, Client(SERVER, token, transport=app_client._transport)).rows == 1
    with Ledger(server_url) as remote:
        [gpu] = remote.read(lambda c: fleet(c))
    assert [(h.host, h.instance_type) for h in gpu.hosts] == [("p4d-01", "p4d.24xlarge"), ("onprem-01", None)]


def test_rows_the_server_sets_aside_are_said_and_the_outbox_moves_on(tmp_path: Path, server) -> None:  # type: ignore[no-untyped-def]
    # A local ledger does not check overlaps (two agents on one host, a clock stepped back): the
    # server stores the first interval of each stretch of time, says why it set the other aside,
    # and the agent acknowledges the batch rather than sending it for ever.
    app_client, server_url, token, _ = server
    local = f"sqlite:///{tmp_path}/local.db"
    _local_rows(local, 3)
    twice = CapacityInterval("GPU-x", "node-1", T0_MS + 5_000, T0_MS + 15_000, States(0, 4000, 6000, 0))
    lines: list[str] = []
    with Ledger(local) as led:
        led.write(lambda c: write_capacity(led.database, c, [twice]))
        report = sync(led, Client(SERVER, token, transport=app_client._transport), progress=lines.append)
        assert report.capacity_rows == 4
        assert push_capacity(led, Client(SERVER, token, transport=app_client._transport)).rows == 0
    assert any("set aside 1 capacity row(s)" in ln and "would count twice" in ln for ln in lines), lines
    with Ledger(server_url) as remote:
        assert sorted(r["t0_ms"] for r in remote.read(lambda c: intervals(c))) == [T0_MS + k * 10_000 for k in range(3)]
