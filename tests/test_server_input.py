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
    """A batch with one good GPU interval (seq 0) and one changed by ``changes`` (seq 1)."""
    good, bad = gpu_rows(2)
    return batch(run_doc(), n=0) | {"gpu_intervals": [good, bad | changes]}


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"run": {}}, ["body", "run", "id"]),
        (batch(run_doc(run_id="not-a-uuid")), ["body", "run", "id"]),
        (batch(run_doc()) | {"surprise": 1}, ["body", "surprise"]),
        (batch(run_doc(status="exploded")), ["body", "run", "status"]),
        (batch(run_doc(status="succeeded", ended_at=NOW - 7200)), ["body", "run"]),  # ended before it started
        (batch(run_doc(started_at=NOW + 10 * 86400)), ["body", "run", "started_at"]),
        (batch(run_doc(interval_s=0)), ["body", "run", "interval_s"]),
        (batch(run_doc()) | {"devices": [{"index": -1, "uuid": "GPU-0", "name": "x"}]}, ["body", "devices", 0]),
        (batch(run_doc()) | {"gpu_rows": {"not": "a list"}}, ["body", "gpu_rows"]),
    ],
)
def test_an_invalid_run_record_refuses_the_batch_with_the_place(ctx, body, where) -> None:  # type: ignore[no-untyped-def]
    client, t, _ = ctx
    detail = _bad(client, t.agent_a, body)
    assert any(d["loc"][: len(where)] == where for d in detail), detail


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"busy_s": -1.0}, "busy_s"),
        ({"t1": NOW - 4000}, "before t0"),
        ({"t0": NOW + 86400, "t1": NOW + 86405}, "future"),
        ({"t0": 12.0, "t1": 17.0}, "t0"),  # 1970: a unit mistake
        ({"busy_s": 1e6}, "exceeds"),  # busier than the interval is long
        ({"energy_j": 1e12}, "energy_j"),
        ({"seq": -1}, "seq"),
        ({"seq": 2**40}, "seq"),
        ({"mem_used_max_b": -5}, "mem_used_max_b"),
        ({"util_max_pct": "lots"}, "util_max_pct"),
        ({"samples": "password=hunter2"}, "samples"),
    ],
)
def test_a_bad_row_is_quarantined_and_the_rest_stored(ctx, changes, reason) -> None:  # type: ignore[no-untyped-def]
    client, t, _ = ctx
    body = _with_gpu(**changes)
    got = _post(client, t.agent_a, body)
    assert got.status_code == 200, got.text
    answer = got.json()
    assert answer["created"] and answer["gpu_intervals"] == 1 and answer["host_intervals"] == 0
    [item] = answer["quarantined"]
    assert (item["series"], item["index"]) == ("gpu_intervals", 1) and reason in item["reason"], item
    run_id = body["run"]["id"]
    stored = client.get(f"/api/v1/runs/{run_id}/intervals", headers=bearer(t.member_a)).json()["gpu"]
    assert [r["seq"] for r in stored] == [0]
    kept = client.get(f"/api/v1/runs/{run_id}/quarantine", headers=bearer(t.member_a)).json()
    assert [(k["series"], k["reason"]) for k in kept] == [("gpu_intervals", item["reason"])]
    assert kept[0]["actor"] == f"agent-a (token {t.agent_a[4:16]})" and kept[0]["token_id"] == t.agent_a[4:16]
    assert "hunter2" not in kept[0]["payload"]  # the stored copy of the row is redacted too
    again = _post(client, t.agent_a, body).json()  # the agent resends: nothing new, nothing twice
    assert again["gpu_intervals"] == 0 and len(again["quarantined"]) == 1
    assert len(client.get(f"/api/v1/runs/{run_id}/quarantine", headers=bearer(t.admin)).json()) == 1


def test_every_kind_of_row_is_judged_on_its_own(ctx) -> None:  # type: ignore[no-untyped-def]
    client, t, _ = ctx
    body = batch(run_doc(), n=3)
    body["gpu_rows"] = [["GPU-0", 10, NOW - 100, NOW - 95, 5, *[None] * 15], ["GPU-0", 11, "late", NOW, 5]]
    body["host_intervals"][2]["cpu_s"] = -3.0
    body["events"].append({"seq": 1, "t": NOW + 86400, "kind": "note"})  # in the future
    body["events"].append({"seq": 2, "t": NOW - 10, "kind": "x" * 65})  # kind too long
    body["metrics"].append({"seq": 1, "t": NOW - 10, "key": "loss", "value": "lots"})
    got = _post(client, t.agent_a, body)
    assert got.status_code == 200, got.text
    answer = got.json()
    assert (answer["gpu_intervals"], answer["host_intervals"], answer["events"], answer["metrics"]) == (4, 2, 1, 1)
    assert [(q["series"], q["index"], q["item"]) for q in answer["quarantined"]] == [
        ("gpu_rows", 1, "GPU-0 seq 11"),
        ("host_intervals", 2, "seq 2"),
        ("events", 1, "seq 1"),
        ("events", 2, "seq 2"),
        ("metrics", 1, "seq 1"),
    ]


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_numbers_are_refused(ctx, token: str) -> None:  # type: ignore[no-untyped-def]
    client, t, _ = ctx
    text = json.dumps(_with_gpu(busy_s=123456.0)).replace("123456.0", token)
    got = _post(client, t.agent_a, text)
    assert got.status_code == 200, got.text
    assert [(q["index"], "finite" in q["reason"]) for q in got.json()["quarantined"]] == [(1, True)]
    in_the_run = json.dumps(batch(run_doc(interval_s=123456.0), n=1)).replace("123456.0", token)
    _bad(client, t.agent_a, in_the_run)


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
    detail = _bad(client, t.agent_a, text)  # in the run record: nothing can be stored
    assert "NUL" in detail[0]["msg"]
    kept = json.dumps(batch(run_doc(name="NAME"), n=1)).replace('"NAME"', '"a\\\\u0000b"')  # a backslash, then text
    assert _post(client, t.agent_a, kept).status_code == 200
    in_an_event = batch(run_doc(), n=1)
    in_an_event["events"][0]["message"] = "MSG"
    got = _post(client, t.agent_a, json.dumps(in_an_event).replace('"MSG"', '"a\\u0000b"'))
    assert got.status_code == 200 and got.json()["events"] == 0 and got.json()["gpu_intervals"] == 1
    assert [(q["series"], "NUL" in q["reason"]) for q in got.json()["quarantined"]] == [("events", True)]
    assert client.get("/api/v1/runs", params={"team": "a\x00b"}, headers=bearer(t.admin)).status_code == 400


def test_secrets_are_redacted_by_the_server_too(ctx) -> None:  # type: ignore[no-untyped-def]
    """An agent that did not redact (old, hand-written, or a rule added since) still stores nothing secret."""
    client, t, url = ctx
    token = t.member_b  # a real gpuledger token, pasted where it should not be
    run = run_doc(
        command=["python", "train.py", "--api-key", "abc123", f"--server-token={token}"],
        labels={"project": "A", "team": "vision", "HF_TOKEN": "hf-secret", "note": f"pushed with {token}"},
        meta={"wandb": {"api_key": "wandb-secret", "entity": "ml"}, "urls": ["postgresql://ml:pgsecret@db/x"]},
        git={"remote": "https://oauth2:ghsecret123@git.example.com/ml/repo.git", "commit": "abc"},
        name=f"run {token}",
    )
    body = batch(run, n=1)
    body["events"][0] |= {"message": f"retrying with {token}", "payload": {"password": "hunter2"}}
    assert _post(client, t.agent_a, body).status_code == 200
    with Ledger(url) as led:
        stored = led.get_run(run["id"])
    events = client.get(f"/api/v1/runs/{run['id']}/events", headers=bearer(t.admin)).json()
    dump = json.dumps([stored.command, stored.labels, stored.meta, stored.git, stored.name, events])
    for secret in ("abc123", token[17:], "hf-secret", "wandb-secret", "pgsecret", "ghsecret123", "hunter2"):
        assert secret not in dump, secret
    assert stored.command[:4] == ["python", "train.py", "--api-key", "[REDACTED:secret-flag]"]
    assert stored.labels["team"] == "vision" and stored.meta["wandb"]["entity"] == "ml"
    assert f"glt_{token[4:16]}_[REDACTED:gpuledger-token]" in events[0]["message"]  # the id stays: revoke it
    assert _post(client, t.agent_a, body).json()["created"] is False  # resent: redacted the same, no change


def test_compact_rows_of_old_and_new_agents_are_all_stored(ctx) -> None:  # type: ignore[no-untyped-def]
    # An agent that predates the coverage columns sends 20 columns, one that predates the exact
    # unmeasured time 23, a current one 24. All are stored, what an old agent did not send left
    # absent (not zero): the readers then judge its unmeasured time by the interval's method.
    from gpuledger.core.wire import GPU_COLUMNS, GPU_COLUMNS_V1, GPU_COLUMNS_V2

    client, tokens, url = ctx
    run = run_doc()
    old, older, new = gpu_rows(3)
    older |= {"util_idle_s": 1.5, "util_unknown_s": 0.25, "proc_method": "pidns", "util_method": "samples"}
    new |= {"util_idle_s": 1.5, "util_unknown_s": 0.25, "proc_method": "pidns", "util_unmeasured_s": 0.125}
    body = batch(run, n=0) | {
        "gpu_rows": [[old.get(c) for c in GPU_COLUMNS_V1], [older.get(c) for c in GPU_COLUMNS_V2],
                     [new.get(c) for c in GPU_COLUMNS]],
    }  # fmt: skip
    got = _post(client, tokens.agent_a, body)
    assert got.status_code == 200, got.text
    from gpuledger.runs.view import summary

    with Ledger(url) as ledger:
        stored = {iv.seq: iv for iv in ledger.gpu_intervals(run["id"])}
        shown = summary(ledger, ledger.get_run(run["id"]))["gpus"][0]
    assert shown["unmeasured_seconds"] == pytest.approx(0.25 + 0.125)  # the 23-column row by its method
    assert (stored[0].util_idle_s, stored[0].util_unknown_s, stored[0].proc_method) == (None, None, None)
    assert (stored[1].util_idle_s, stored[1].util_unknown_s, stored[1].proc_method) == (1.5, 0.25, "pidns")
    assert [stored[i].util_unmeasured_s for i in range(3)] == [None, None, 0.125]
