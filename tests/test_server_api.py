"""The team server's API on a real PostgreSQL (and SQLite): ingest, reads, idempotency, audit."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient

from gpuledger.core.metering.summary import summarize
from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, SchemaOutdated, audit
from server_support import NOW, Tokens, batch, bearer, fresh_pg_url, gpu_rows, run_doc, setup_accounts


@dataclass
class Api:
    client: TestClient
    url: str
    tokens: Tokens

    def post(self, token: str, body: dict, **kw):  # type: ignore[no-untyped-def]
        return self.client.post("/api/v1/ingest", json=body, headers=bearer(token), **kw)

    def get(self, token: str, path: str, **kw):  # type: ignore[no-untyped-def]
        return self.client.get("/api/v1" + path, headers=bearer(token), **kw)


def _api(url: str) -> Iterator[Api]:
    tokens = setup_accounts(url)
    with TestClient(create_app(url, settings=Settings(token_cache_s=0))) as client:
        yield Api(client, url, tokens)


@pytest.fixture
def api() -> Iterator[Api]:
    with fresh_pg_url() as url:
        yield from _api(url)


@pytest.fixture
def any_api(ledger_url: str) -> Iterator[Api]:
    """The same API on SQLite and PostgreSQL."""
    yield from _api(ledger_url)


def test_server_refuses_an_outdated_schema() -> None:
    with fresh_pg_url() as url, pytest.raises(SchemaOutdated, match="gpuledger db migrate"):
        create_app(url)


def test_ingest_is_idempotent_and_reads_back_what_was_sent(any_api: Api) -> None:
    api, t = any_api, any_api.tokens
    body = batch(run_doc(), n=20, devices=2)
    first = api.post(t.agent_a, body)
    assert first.status_code == 200, first.text
    assert first.json() | {"run_id": None} == {
        "run_id": None, "created": True, "gpu_intervals": 40, "host_intervals": 20, "events": 1, "metrics": 1,
        "dropped_rolled_up": 0, "sealed": False, "quarantined": [],
    }  # fmt: skip
    again = api.post(t.agent_a, body).json()
    assert (again["created"], again["gpu_intervals"], again["host_intervals"], again["events"]) == (False, 0, 0, 0)
    run_id = body["run"]["id"]
    got = api.get(t.admin, f"/runs/{run_id}/intervals").json()
    assert len(got["gpu"]) == 40 and len(got["host"]) == 20
    sent = {(r["device_uuid"], r["seq"]): r for r in body["gpu_intervals"]}
    for row in got["gpu"]:
        src = sent[(row["gpu_uuid"], row["seq"])]
        assert (row["busy_s"], row["energy_j"], row["mem_used_max_b"]) == (
            src["busy_s"],
            src["energy_j"],
            src["mem_used_max_b"],
        )
        assert json.loads(row["throttle_s"]) == {"power": 0.25}
    assert [e["kind"] for e in api.get(t.admin, f"/runs/{run_id}/events").json()] == ["alert"]
    assert api.get(t.admin, f"/runs/{run_id}/metrics").json()[0]["value"] == 0.5


def test_run_json_is_the_same_as_gpuledger_show(any_api: Api) -> None:
    api, t = any_api, any_api.tokens
    body = batch(run_doc(status="succeeded", ended_at=NOW - 100, exit_code=0), n=12, devices=2, final=True)
    assert api.post(t.agent_a, body).json()["sealed"] is True
    shown = api.get(t.member_a, f"/runs/{body['run']['id']}").json()
    with Ledger(api.url) as led:
        run = led.get_run(body["run"]["id"])
        local = summarize(run, led.devices(run.id), led.gpu_intervals(run.id), led.host_intervals(run.id), now=NOW)
    for key in ("id", "status", "labels", "gpus", "host", "wall_seconds", "started_at", "ended_at"):
        assert shown[key] == json.loads(json.dumps(local[key])), key
    assert "epochs" in shown and "attempts" in shown


def test_run_end_label_change_and_late_push_are_audited(api: Api) -> None:
    t = api.tokens
    run = run_doc()
    api.post(t.agent_a, batch(run, n=5))
    api.post(t.agent_a, {"run": run | {"labels": {"project": "A", "team": "detection"}}})
    ended = run | {
        "labels": {"project": "A", "team": "detection"},
        "status": "failed",
        "ended_at": NOW - 10,
        "exit_code": 1,
    }
    assert api.post(t.agent_a, {"run": ended, "final": True}).json()["sealed"]
    late = api.post(t.agent_a, {"run": ended, "gpu_intervals": gpu_rows(2, first_seq=5)}).json()
    assert late["gpu_intervals"] == 2 and late["sealed"]  # a late push to a sealed run reseals it
    stale = api.post(t.agent_a, {"run": run}).json()  # an old "running" record never reopens the run
    assert stale["created"] is False and api.get(t.admin, f"/runs/{run['id']}").json()["status"] == "failed"
    with Ledger(api.url) as led:
        actions = [r["action"] for r in led.read(lambda c: list(c.execute(audit.T.audit_log.select()).mappings()))]
        assert actions[-7:] == [
            "gpu.registered", "run.created", "run.changed", "run.changed", "run.ended", "run.sealed", "run.resealed"
        ]  # fmt: skip
        assert audit.verify(led).ok


def test_list_filters_alerts_me_and_log(api: Api) -> None:
    t = api.tokens
    a = run_doc(labels={"project": "A", "team": "vision"})
    b = run_doc(labels={"project": "A", "team": "nlp"}, status="succeeded", ended_at=NOW - 5)
    for r in (a, b):
        assert api.post(t.agent_a, batch(r, n=3)).status_code == 200
    rows = api.get(t.member_a, "/runs", params={"team": "nlp"}).json()
    assert [r["id"] for r in rows] == [b["id"]] and rows[0]["gpus"] == 1
    assert [r["id"] for r in api.get(t.member_a, "/runs", params={"status": "running"}).json()] == [a["id"]]
    assert len(api.get(t.member_a, "/runs", params={"since": "2d", "limit": 1}).json()) == 1
    alerts = api.get(t.member_a, "/alerts/recent").json()
    assert {x["run_id"] for x in alerts} == {a["id"], b["id"]} and alerts[0]["kind"] == "alert"
    assert api.get(t.agent_a, "/me").json() == {
        "user": "agent-a", "role": "agent", "projects": ["A"], "token_id": t.agent_a[4:16],
        "ledger_has_runs": True,  # a yes/no only: lets runs --server tell "none visible" from "none yet"
    }  # fmt: skip
    put = api.client.put(
        f"/api/v1/runs/{a['id']}/log", content=b"line 1\n<script>x</script>\n", headers=bearer(t.agent_a)
    )
    assert put.status_code == 200, put.text
    log = api.get(t.member_a, f"/runs/{a['id']}/log")
    assert log.content == b"line 1\n<script>x</script>\n" and log.headers["content-type"].startswith("text/plain")
    csv = api.get(t.member_a, f"/runs/{a['id']}/export", params={"format": "csv"})
    assert csv.status_code == 200 and csv.text.startswith("run_id,series,seq")


def test_unauthenticated_and_revoked(api: Api) -> None:
    assert api.client.get("/api/v1/runs").status_code == 401
    assert api.client.get("/api/v1/runs", headers=bearer("glt_0123456789ab_nope")).status_code == 401
    assert api.client.get("/api/v1/runs", headers={"Authorization": "Basic eDp5"}).status_code == 401
    assert api.client.get("/healthz").json()["status"] == "ok"
    from gpuledger.store import accounts

    with Ledger(api.url) as led:
        token_id = api.tokens.member_a[4:16]
        accounts.revoke_token(led, token_id, actor="test")
    assert api.get(api.tokens.member_a, "/runs").status_code == 401


def test_members_cannot_write_and_agents_only_their_projects(api: Api) -> None:
    t = api.tokens
    assert api.post(t.member_a, batch(run_doc())).status_code == 403
    assert api.post(t.agent_a, batch(run_doc(project="B"))).status_code == 403
    assert api.post(t.agent_a, batch(run_doc(project=None))).status_code == 403
    run_b = run_doc(project="B")
    assert api.post(t.agent_b, batch(run_b)).status_code == 200
    # agent A claiming B's run for its own project: the run "does not exist" for it
    hijack = api.post(t.agent_a, batch(run_b | {"labels": {"project": "A"}}))
    assert hijack.status_code == 404
    assert api.get(t.admin, f"/runs/{run_b['id']}").json()["labels"]["project"] == "B"
    assert api.client.put(f"/api/v1/runs/{run_b['id']}/log", content=b"x", headers=bearer(t.agent_a)).status_code == 404
    assert api.post(t.admin, batch(run_doc(project=None))).status_code == 200  # admins write anything


def test_chargeback_is_scoped(api: Api) -> None:
    t = api.tokens
    month = __import__("time").strftime("%Y-%m", __import__("time").gmtime(NOW - 3600))
    for token, project in ((t.agent_a, "A"), (t.agent_b, "B")):
        run = run_doc(project=project, status="succeeded", ended_at=NOW - 60)
        assert api.post(token, batch(run, n=30, final=True)).status_code == 200
    got = api.get(t.member_a, "/reports/chargeback", params={"month": month, "by": "project"})
    assert got.status_code == 200, got.text  # the cost module ships with the server: a 501 is a failure
    projects = {g["project"] for g in got.json()["groups"]}
    assert projects == {"A"}
    both = api.get(t.admin, "/reports/chargeback", params={"month": month, "by": "project"}).json()
    assert {g["project"] for g in both["groups"]} == {"A", "B"}
    assert api.get(t.member_a, "/reports/chargeback", params={"month": "2026-13", "by": "x"}).status_code == 422
    by_status = api.get(t.admin, "/reports/chargeback", params={"month": month, "by": "status"})
    assert by_status.status_code == 422 and "/runs?status=" in by_status.json()["detail"]  # was a 500


def test_openapi_is_published(api: Api) -> None:
    doc = api.client.get("/openapi.json").json()
    assert "/api/v1/ingest" in doc["paths"] and "IngestBatch" in doc["components"]["schemas"]
    assert uuid.UUID(api.tokens.admin[4:16].ljust(32, "0"))  # token ids are plain hex
