"""Bad input: schema errors are clear 422s, absurd values are refused, oversized bodies are 413,
and SQL or script injection attempts are plain text, stored and returned verbatim."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, accounts
from server_support import NOW, Tokens, batch, bearer, fresh_pg_url, gpu_rows, run_doc, setup_accounts

INJECTIONS = [
    "'; DROP TABLE runs; --",
    "Robert'); DELETE FROM audit_log WHERE ('1'='1",
    '" OR 1=1 --',
    "<script>alert('x')</script>",
    "<img src=x onerror=alert(1)>",
    "{{7*7}} ${7*7} %(x)s :name $1",
    "ünïcödé ✓ 🚀",
]


@pytest.fixture(scope="module")
def ctx() -> Iterator[tuple[TestClient, Tokens, str]]:
    with fresh_pg_url() as url:
        tokens = setup_accounts(url)
        with TestClient(create_app(url, settings=Settings(max_body_b=1024 * 1024))) as client:
            yield client, tokens, url


def _post(client: TestClient, token: str, body: object, **kw):  # type: ignore[no-untyped-def]
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    headers = bearer(token) | {"Content-Type": "application/json"} | kw.pop("headers", {})
    return client.post("/api/v1/ingest", content=content, headers=headers, **kw)


def _bad(client: TestClient, token: str, body: object) -> list[dict]:  # type: ignore[type-arg]
    got = _post(client, token, body)
    assert got.status_code == 422, got.text
    detail = got.json()["detail"]
    assert isinstance(detail, list) and all("loc" in d and "msg" in d for d in detail), detail
    return detail


def _with_gpu(**changes: object) -> dict:  # type: ignore[type-arg]
    row = gpu_rows(1)[0] | changes
    return batch(run_doc(), n=0) | {"gpu_intervals": [row]}


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"run": {}}, ["body", "run", "id"]),
        (batch(run_doc(run_id="not-a-uuid")), ["body", "run", "id"]),
        (batch(run_doc()) | {"surprise": 1}, ["body", "surprise"]),
        (_with_gpu(busy_s=-1.0), ["body", "gpu_intervals", 0, "busy_s"]),
        (_with_gpu(t1=NOW - 4000), ["body", "gpu_intervals", 0]),  # t1 before t0
        (_with_gpu(t0=NOW + 86400, t1=NOW + 86405), ["body", "gpu_intervals", 0]),  # the future
        (_with_gpu(t0=12.0, t1=17.0), ["body", "gpu_intervals", 0, "t0"]),  # 1970: a unit mistake
        (_with_gpu(busy_s=1e6), ["body", "gpu_intervals", 0]),  # busier than the interval is long
        (_with_gpu(energy_j=1e12), ["body", "gpu_intervals", 0]),
        (_with_gpu(seq=-1), ["body", "gpu_intervals", 0, "seq"]),
        (_with_gpu(seq=2**40), ["body", "gpu_intervals", 0, "seq"]),
        (_with_gpu(mem_used_max_b=-5), ["body", "gpu_intervals", 0, "mem_used_max_b"]),
        (_with_gpu(util_max_pct="lots"), ["body", "gpu_intervals", 0, "util_max_pct"]),
        (batch(run_doc(status="exploded")), ["body", "run", "status"]),
        (batch(run_doc(status="succeeded", ended_at=NOW - 7200)), ["body", "run"]),  # ended before it started
        (batch(run_doc(started_at=NOW + 10 * 86400)), ["body", "run", "started_at"]),
    ],
)
def test_invalid_batches_are_422_with_the_place(ctx, body, where) -> None:  # type: ignore[no-untyped-def]
    client, t, _ = ctx
    detail = _bad(client, t.agent_a, body)
    assert any(d["loc"][: len(where)] == where for d in detail), detail


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_numbers_are_refused(ctx, token: str) -> None:  # type: ignore[no-untyped-def]
    client, t, _ = ctx
    text = json.dumps(_with_gpu(busy_s=123456.0)).replace("123456.0", token)
    _bad(client, t.agent_a, text)


def test_malformed_json_and_empty_body(ctx) -> None:  # type: ignore[no-untyped-def]
    client, t, _ = ctx
    for body in (b"{", b"", b"[]", b"null", b'{"run": ', "\ud800".encode("utf-8", "surrogatepass")):
        assert _post(client, t.agent_a, body).status_code == 422


def test_oversized_bodies_are_413(ctx) -> None:  # type: ignore[no-untyped-def]
    client, t, _ = ctx
    big = json.dumps(batch(run_doc(), n=3000))  # ~1.5 MB, over this server's 1 MiB limit
    assert len(big) > 1024 * 1024
    assert _post(client, t.agent_a, big).status_code == 413

    def chunks():  # type: ignore[no-untyped-def]
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536].encode()

    chunked = client.post("/api/v1/ingest", content=chunks(), headers=bearer(t.agent_a))
    assert chunked.status_code == 413
    assert "limit" in chunked.json()["detail"]


def test_injection_attempts_are_stored_and_returned_verbatim(ctx) -> None:  # type: ignore[no-untyped-def]
    client, t, url = ctx
    for i, text in enumerate(INJECTIONS):
        labels = {"project": "A", "team": text, text[:100] or "k": text}
        run = run_doc(name=text, labels=labels, command=["python", text], user=text, host=text)
        body = batch(run, n=2)
        body["events"][0] |= {"kind": "alert", "message": text, "payload": {"why": text}}
        body["metrics"][0] |= {"key": text}
        got = _post(client, t.agent_a, body)
        assert got.status_code == 200, (i, got.text)
        shown = client.get(f"/api/v1/runs/{run['id']}", headers=bearer(t.admin))
        assert shown.headers["content-type"] == "application/json"
        doc = shown.json()
        assert (doc["name"], doc["user"], doc["host"], doc["command"][1]) == (text, text, text, text)
        assert doc["labels"] == labels
        listed = client.get("/api/v1/runs", headers=bearer(t.member_a), params={"team": text}).json()
        assert [r["id"] for r in listed] == [run["id"]]
        events = client.get(f"/api/v1/runs/{run['id']}/events", headers=bearer(t.admin)).json()
        assert events[0]["message"] == text and events[0]["payload"] == {"why": text}
    with Ledger(url) as led:  # the tables are all still there, and so is the audit chain
        from gpuledger.store import audit

        assert len(led.list_runs()) >= len(INJECTIONS)
        assert audit.verify(led).ok
        for text in INJECTIONS[:3]:
            accounts.add_project(led, text, actor="test")
        assert set(INJECTIONS[:3]) <= set(accounts.list_projects(led))


def test_log_is_served_as_inert_text(ctx) -> None:  # type: ignore[no-untyped-def]
    client, t, _ = ctx
    run = run_doc()
    assert _post(client, t.agent_a, batch(run, n=1)).status_code == 200
    html = b"<html><script>alert(document.cookie)</script></html>"
    client.put(f"/api/v1/runs/{run['id']}/log", content=html, headers=bearer(t.agent_a))
    got = client.get(f"/api/v1/runs/{run['id']}/log", headers=bearer(t.member_a))
    assert got.content == html
    assert got.headers["content-type"].startswith("text/plain") and got.headers["x-content-type-options"] == "nosniff"


def test_bad_query_parameters_are_422(ctx) -> None:  # type: ignore[no-untyped-def]
    client, t, _ = ctx
    h = bearer(t.admin)
    assert client.get("/api/v1/runs", params={"limit": 0}, headers=h).status_code == 422
    assert client.get("/api/v1/runs", params={"limit": "x"}, headers=h).status_code == 422
    assert client.get("/api/v1/runs", params={"since": "yesterday-ish"}, headers=h).status_code == 422
    assert client.get("/api/v1/runs", params={"since": "nan"}, headers=h).status_code == 422
    assert client.get("/api/v1/runs", params={"status": "weird"}, headers=h).status_code == 422
    run = run_doc()
    _post(client, t.agent_a, batch(run, n=1))
    bad = client.get(f"/api/v1/runs/{run['id']}/intervals", params={"after_t": "inf"}, headers=h)
    assert bad.status_code == 422


def test_nul_characters_are_refused_not_500(ctx) -> None:  # type: ignore[no-untyped-def]
    client, t, _ = ctx
    text = json.dumps(batch(run_doc(name="NAME"), n=1)).replace('"NAME"', '"a\\u0000b"')
    detail = _bad(client, t.agent_a, text)
    assert "NUL" in detail[0]["msg"]
    kept = json.dumps(batch(run_doc(name="NAME"), n=1)).replace('"NAME"', '"a\\\\u0000b"')  # a backslash, then text
    assert _post(client, t.agent_a, kept).status_code == 200
    assert client.get("/api/v1/runs", params={"team": "a\x00b"}, headers=bearer(t.admin)).status_code == 400
