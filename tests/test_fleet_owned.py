"""The attacks of issue 33 on the fleet, each against a real ``gpuledger serve`` (a child process)
on PostgreSQL and on SQLite, with the audit trail signed: an agent of project B pushing capacity and
sightings for project A's GPU (a new model, host and price; an hour counted twice; a month of
"unobserved" time before the GPU existed), GPU squatting ahead of the real host, and SQL edits of
the fleet, a token's host and the quarantine, capacity pushed into a closed month. Each is refused,
set aside or named by ``verify``, and an enrolled node's normal month verifies clean."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from audit_support import audit_key, audit_rows, keyring, payload_of, sql
from gpuledger.core.audit.signing import SigningKey
from gpuledger.store import Ledger, audit, closed_months
from gpuledger.store.capacity_queries import fleet
from server_support import (
    BACKENDS,
    NOW,
    ServerProcess,
    Tokens,
    backend_url,
    batch,
    bearer,
    enroll,
    run_doc,
    setup_accounts,
)

pytestmark = pytest.mark.slow

NODE_A, NODE_B = "gpu-node-1", "gpu-node-B"  # project A's machine, project B's machine
A100, H200 = "NVIDIA A100-SXM4-80GB", "NVIDIA H200"
HOUR_MS = 3_600_000
T0_MS = (int(NOW) // 86400 - 3) * 86_400_000  # three days ago, midnight UTC


@dataclass
class Served:
    url: str
    server: ServerProcess
    tokens: Tokens
    node_a: str  # agent token bound to gpu-node-1 (project A's enrolled node)
    node_b: str  # agent token bound to gpu-node-B (project B's enrolled node)
    key: SigningKey

    def capacity(self, token: str, intervals: list[list[Any]], gpus: list[dict[str, Any]]) -> httpx.Response:
        body = {"intervals": intervals, "gpus": gpus}
        return httpx.post(self.server.url + "/api/v1/capacity", json=body, headers=bearer(token), timeout=60)

    def ingest(self, token: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(self.server.url + "/api/v1/ingest", json=body, headers=bearer(token), timeout=60)

    def problems(self) -> list[str]:
        with Ledger(self.url) as led:
            return audit.verify(led, keyring=keyring(self.key)).problems

    def fleet(self) -> dict[str, Any]:
        with Ledger(self.url) as led:
            return {g.uuid: g for g in led.read(lambda c: fleet(c))}


@pytest.fixture(scope="module", params=BACKENDS)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("fleet")
    with backend_url(request.param, tmp) as url, audit_key() as key:
        tokens = setup_accounts(url)
        node_a, node_b = enroll(url, NODE_A, ["A"]), enroll(url, NODE_B, ["B"])
        # The month of capacity below reaches into last month: months close after 62 days here
        # (test_a_closed_months_capacity_does_not_change runs a server with the default).
        env = {"GPULEDGER_CLOSE_AFTER_DAYS": "62"}
        with ServerProcess(url, log=tmp / "server.log", env=env) as server:
            yield Served(url, server, tokens, node_a, node_b, key)


def _iv(uuid: str, host: str, t0: int, t1: int, busy: bool = True) -> list[Any]:
    span = t1 - t0
    return [uuid, host, t0, t1, 0, 0 if busy else span, span if busy else 0, 0, 0, None]


def _seen(uuid: str, host: str, first_ms: int, last_ms: int, name: str = A100, **extra: Any) -> dict[str, Any]:
    return {"uuid": uuid, "name": name, "host": host, "first_seen": first_ms / 1000, "last_seen": last_ms / 1000,
            **extra}  # fmt: skip


def _hours(uuid: str, host: str, first_ms: int, n: int) -> list[list[Any]]:
    return [_iv(uuid, host, first_ms + k * HOUR_MS, first_ms + (k + 1) * HOUR_MS) for k in range(n)]


def _sighted(s: Served, uuid: str, hours: int = 4) -> None:
    """``uuid`` is one of node A's GPUs: sighted by it at T0_MS and metered for ``hours``."""
    got = s.capacity(
        s.node_a, _hours(uuid, NODE_A, T0_MS, hours), [_seen(uuid, NODE_A, T0_MS, T0_MS + hours * HOUR_MS)]
    )
    assert got.status_code == 200 and got.json() == {"received": hours, "stored": hours, "quarantined": []}, got.text


def _busy_ms(s: Served, uuid: str) -> int:
    q = sa.text("SELECT coalesce(sum(busy_attr_ms), 0) FROM gpu_capacity_days WHERE gpu_uuid = :u")
    with Ledger(s.url) as led:
        return int(led.read(lambda c: c.execute(q, {"u": uuid}).scalar_one()))


def test_only_the_nodes_own_token_reports_its_gpus_capacity_and_sightings(served: Served) -> None:
    _sighted(served, "GPU-own-0")
    before = served.fleet()["GPU-own-0"]
    # project B's agent makes A's A100 an H200 on its host (priced 7.91 instead of 3.43)
    forged = [_seen("GPU-own-0", "evil-host-B", T0_MS, T0_MS + 5 * HOUR_MS, H200, instance_type="p5en.48xlarge")]
    later = [_iv("GPU-own-0", "evil-host-B", T0_MS + 4 * HOUR_MS, T0_MS + 5 * HOUR_MS)]
    got = served.capacity(served.tokens.agent_b, later, forged)  # an agent token bound to no host
    assert got.status_code == 403 and "agent token bound to the node" in got.json()["detail"], got.text
    got = served.capacity(served.tokens.admin, later, forged)  # not even an admin's: capacity is the node's
    assert got.status_code == 403, got.text
    got = served.capacity(served.node_b, later, forged)  # B's enrolled node, naming another host
    assert got.status_code == 403 and "is not this token's host 'gpu-node-B'" in got.json()["detail"], got.text
    mine = [_iv("GPU-own-0", NODE_B, T0_MS + 4 * HOUR_MS, T0_MS + 5 * HOUR_MS)]  # B's node, its own host name
    got = served.capacity(served.node_b, mine, [_seen("GPU-own-0", NODE_B, T0_MS, T0_MS + 5 * HOUR_MS, H200)])
    assert got.status_code == 403 and "GPU GPU-own-0 belongs to host 'gpu-node-1'" in got.json()["detail"], got.text
    assert served.fleet()["GPU-own-0"] == before  # model, host, hosts and first sighting as node A said
    assert _busy_ms(served, "GPU-own-0") == 4 * HOUR_MS
    assert served.problems() == []


def test_capacity_that_would_count_a_gpus_time_twice_is_set_aside(served: Served) -> None:
    _sighted(served, "GPU-twice-0")
    shifted = _iv("GPU-twice-0", NODE_A, T0_MS + HOUR_MS // 2, T0_MS + 3 * HOUR_MS // 2)  # over hours 0 and 1
    fresh = _hours("GPU-twice-0", NODE_A, T0_MS + 4 * HOUR_MS, 2)
    inner = _iv("GPU-twice-0", NODE_A, T0_MS + 5 * HOUR_MS - 1000, T0_MS + 5 * HOUR_MS + 1000)  # inside the batch
    again = _hours("GPU-twice-0", NODE_A, T0_MS, 1)[0]  # sent again: stored once, not an overlap
    got = served.capacity(served.node_a, [shifted, *fresh, inner, again], [])
    assert got.status_code == 200, got.text
    answer = got.json()
    assert answer["stored"] == 2
    aside = {q["index"]: q["reason"] for q in answer["quarantined"]}
    assert set(aside) == {0, 3} and "overlaps the stored interval" in aside[0] and "in this batch" in aside[3]
    assert _busy_ms(served, "GPU-twice-0") == 6 * HOUR_MS  # each hour once
    (row,) = [r for r in audit_rows(served.url) if r["action"] == "capacity.quarantined"
              and "GPU-twice-0" in r["payload"]]  # fmt: skip
    assert payload_of(row)["count"] == 2 and row["actor"].startswith("gpu-node-1 (token")
    assert served.problems() == []


def test_no_capacity_and_no_sighting_before_the_gpu_was_first_seen(served: Served) -> None:
    _sighted(served, "GPU-new-0")
    june = T0_MS - 30 * 86_400_000  # a month before the GPU was ever sighted
    got = served.capacity(served.node_a, _hours("GPU-new-0", NODE_A, june, 2), [])
    assert got.status_code == 200 and got.json()["stored"] == 0, got.text
    assert all("before the GPU's first sighting" in q["reason"] for q in got.json()["quarantined"])
    earlier = _seen("GPU-new-0", NODE_A, june, T0_MS + 5 * HOUR_MS)  # moving the first sighting back a month
    got = served.capacity(served.node_a, [], [earlier])
    (aside,) = got.json()["quarantined"]
    assert aside["series"] == "gpus" and "never moves back" in aside["reason"]
    assert served.fleet()["GPU-new-0"].first_seen == T0_MS / 1000  # no month of "unobserved" time
    unseen = served.capacity(served.node_a, _hours("GPU-never-0", NODE_A, T0_MS, 1), [])  # never sighted
    assert "never sighted" in unseen.json()["quarantined"][0]["reason"]
    assert served.problems() == []


def test_gpus_cannot_be_squatted_ahead_of_their_enrolled_host(served: Served) -> None:
    # Project B's old (unbound) agent names A's GPUs first, under A's host name.
    squat = run_doc(project="B") | {"host": NODE_A}
    body = batch(squat, n=3)
    body["devices"][0]["uuid"] = "GPU-sq-0"
    for row in body["gpu_intervals"]:
        row["device_uuid"] = "GPU-sq-0"
    assert served.ingest(served.tokens.agent_b, body).status_code == 200  # registered provisionally
    # B's enrolled node cannot speak for A's host at all
    other = run_doc(project="B") | {"host": NODE_A}
    got = served.ingest(served.node_b, batch(other, n=2))
    assert got.status_code == 403 and "bound to host 'gpu-node-B'" in got.json()["detail"], got.text
    # the real node's push is taken, and the GPU is its own from now on
    real = run_doc(project="A", started_at=NOW - 3000)
    body = batch(real, n=3)
    body["devices"][0]["uuid"] = "GPU-sq-0"
    for row in body["gpu_intervals"]:
        row["device_uuid"] = "GPU-sq-0"
    got = served.ingest(served.node_a, body)
    assert got.status_code == 200, got.text
    claimed = [payload_of(r) for r in audit_rows(served.url) if r["action"] == "gpu.claimed"
               and r["object"] == "gpu:GPU-sq-0"]  # fmt: skip
    assert claimed and claimed[-1]["from_user"] == "agent-b" and claimed[-1]["host"] == NODE_A
    # now the squatter is refused, and so is B's enrolled node under its own name
    again = run_doc(project="B") | {"host": NODE_A}
    body = batch(again, n=2)
    body["devices"][0]["uuid"] = "GPU-sq-0"
    body["gpu_intervals"] = []
    got = served.ingest(served.tokens.agent_b, body)
    assert got.status_code == 409 and "GPU GPU-sq-0 belongs to host 'gpu-node-1'" in got.text, got.text
    body["run"] = run_doc(project="B") | {"host": NODE_B}
    got = served.ingest(served.node_b, body)
    assert got.status_code == 409 and "GPU GPU-sq-0 belongs to host 'gpu-node-1'" in got.text, got.text
    assert served.problems() == []


def test_an_enrolled_nodes_month_of_capacity_and_runs_verifies_clean(served: Served) -> None:
    month = T0_MS - 27 * 86_400_000
    gpus = ("GPU-month-0", "GPU-month-1")
    for day in range(30):  # a day per push, as an agent that pushes every few seconds adds up to
        start = month + day * 86_400_000
        ivs = [iv for g in gpus for iv in _hours(g, NODE_A, start, 24)]
        seen = [_seen(g, NODE_A, month, start + 24 * HOUR_MS, instance_type="p4de.24xlarge") for g in gpus]
        got = served.capacity(served.node_a, ivs, seen)
        assert got.status_code == 200 and got.json()["stored"] == 48 and not got.json()["quarantined"], got.text
    run = run_doc(project="A", status="succeeded", ended_at=NOW - 600, exit_code=0)
    got = served.ingest(served.node_a, batch(run, n=20, final=True))
    assert got.status_code == 200 and got.json()["sealed"], got.text
    assert _busy_ms(served, "GPU-month-0") == 30 * 24 * HOUR_MS
    changed = [payload_of(r) for r in audit_rows(served.url) if r["action"] == "fleet.changed"
               and "GPU-month-0" in payload_of(r)["gpus"]]  # fmt: skip
    assert 0 < len(changed) <= 31  # when the record changes: its last sighting's day, not every push
    assert served.problems() == []


def _named(s: Served, part: str) -> None:
    problems = s.problems()
    assert any(part in p for p in problems), problems


def test_verify_names_sql_edits_of_the_fleet_a_tokens_host_and_the_quarantine(served: Served) -> None:
    _sighted(served, "GPU-edit-0")
    got = served.capacity(served.node_a, [], [_seen("GPU-edit-0", NODE_A, T0_MS, T0_MS + 5 * HOUR_MS,
                                                    instance_type="p4de.24xlarge")])  # fmt: skip
    assert got.status_code == 200
    assert served.problems() == []
    edits = [
        ("UPDATE gpu_fleet SET name = 'NVIDIA H200' WHERE uuid = 'GPU-edit-0'",
         "UPDATE gpu_fleet SET name = 'NVIDIA A100-SXM4-80GB' WHERE uuid = 'GPU-edit-0'",
         "gpu_fleet GPU-edit-0: name is 'NVIDIA H200', the audit trail says 'NVIDIA A100-SXM4-80GB'"),
        ("UPDATE gpu_fleet SET host = 'evil-host-B' WHERE uuid = 'GPU-edit-0'",
         "UPDATE gpu_fleet SET host = 'gpu-node-1' WHERE uuid = 'GPU-edit-0'",
         "gpu_fleet GPU-edit-0: host is 'evil-host-B'"),
        ("UPDATE gpu_fleet SET first_seen = first_seen - 2592000 WHERE uuid = 'GPU-edit-0'",
         "UPDATE gpu_fleet SET first_seen = first_seen + 2592000 WHERE uuid = 'GPU-edit-0'",
         "gpu_fleet GPU-edit-0: first_seen is"),
        ("UPDATE gpu_fleet_hosts SET instance_type = 'p5en.48xlarge' WHERE uuid = 'GPU-edit-0'",
         "UPDATE gpu_fleet_hosts SET instance_type = 'p4de.24xlarge' WHERE uuid = 'GPU-edit-0'",
         "stay on 'gpu-node-1': instance_type is 'p5en.48xlarge'"),
        ("UPDATE gpu_fleet SET last_seen = last_seen + 864000 WHERE uuid = 'GPU-edit-0'",
         "UPDATE gpu_fleet SET last_seen = last_seen - 864000 WHERE uuid = 'GPU-edit-0'",
         "gpu_fleet GPU-edit-0: last_day is"),
    ]  # fmt: skip
    for edit, undo, named in edits:
        sql(served.url, edit)
        _named(served, named)
        sql(served.url, undo)
    assert served.problems() == []
    # a token's host set with SQL: B's old agent made A's node
    agent_b = served.tokens.agent_b[4:16]
    sql(served.url, f"UPDATE api_tokens SET host = 'gpu-node-1' WHERE id = '{agent_b}'")
    _named(served, f"api_tokens {agent_b}: bound to host 'gpu-node-1', the audit trail says None")
    sql(served.url, f"UPDATE api_tokens SET host = NULL WHERE id = '{agent_b}'")
    # a refused row of a run is evidence: deleting or rewriting it shows
    run = run_doc(project="A")
    body = batch(run, n=3)
    body["gpu_intervals"][1]["t1"] = body["gpu_intervals"][1]["t0"] - 1  # ends before it starts
    got = served.ingest(served.node_a, body)
    assert got.status_code == 200 and len(got.json()["quarantined"]) == 1, got.text
    assert served.problems() == []
    where = f"run_id = '{run['id']}'"
    sql(served.url, f"UPDATE quarantined_rows SET reason = 'fine' WHERE {where}")
    _named(served, f"quarantined_rows of run {run['id']}: gpu_intervals row 'GPU-0 seq 1' was edited")
    sql(served.url, f"DELETE FROM quarantined_rows WHERE {where}")
    _named(served, f"quarantined_rows of run {run['id']}: gpu_intervals row kept at audit seq")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_closed_months_capacity_does_not_change(backend: str, tmp_path: Path) -> None:
    with backend_url(backend, tmp_path) as url, audit_key() as key:
        setup_accounts(url)
        node = enroll(url, NODE_A, ["A"])
        with ServerProcess(url, log=tmp_path / "server.log") as server:  # the default window (3 days)
            now = time.time()
            boundary = closed_months.boundary(now)
            closed_ms = int(boundary - 20 * 86400) * 1000  # an hour in a month whose bill is out
            open_ms = int(now - 7200) * 1000  # an hour of the open month
            new = _seen("GPU-late-0", NODE_A, closed_ms - 20 * 86_400_000, open_ms + HOUR_MS)
            gone = _seen("GPU-gone-0", NODE_A, closed_ms, closed_ms + HOUR_MS)  # seen only back then
            ivs = [_iv("GPU-late-0", NODE_A, closed_ms, closed_ms + HOUR_MS), _iv("GPU-late-0", NODE_A, open_ms,
                   open_ms + HOUR_MS)]  # fmt: skip
            got = httpx.post(server.url + "/api/v1/capacity", json={"intervals": ivs, "gpus": [new, gone]},
                             headers=bearer(node), timeout=60)  # fmt: skip
            assert got.status_code == 200 and got.json()["stored"] == 1, got.text
            reasons = {(q["series"], q["index"]): q["reason"] for q in got.json()["quarantined"]}
            assert "closed month" in reasons[("intervals", 0)]
            assert "enters the fleet at" in reasons[("gpus", 0)] and "adds nothing" in reasons[("gpus", 1)]
            with Ledger(url) as led:
                held = {g.uuid: g for g in led.read(lambda c: fleet(c))}
                assert held["GPU-late-0"].first_seen == boundary  # no unobserved time in a closed month
                assert "GPU-gone-0" not in held
                q = sa.text("SELECT count(*) FROM gpu_capacity WHERE gpu_uuid = 'GPU-late-0'")
                assert led.read(lambda c: c.execute(q).scalar_one()) == 1
                assert audit.verify(led, keyring=keyring(key)).problems == []
