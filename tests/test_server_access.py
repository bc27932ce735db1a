"""Access control, endpoint by endpoint: a member of project A gets nothing of project B, whatever
the route (the API's, and any route another module adds), filter, export or aggregate report,
and a guessed run id of B looks exactly like a run that does not exist. Runs without a project
label are for admins only: no member, of any project, sees them anywhere."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from gpuledger.core.ids import short_id
from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from server_support import NOW, Tokens, batch, bearer, fresh_pg_url, run_doc, setup_accounts

SECRET_B = "secret-of-project-B"
SECRET_NONE = "secret-of-a-run-without-project"


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[TestClient, Tokens, dict[str, str]]]:
    """Runs of A (one running, one ended), of B, and two without a project label (an admin's push:
    one ended, one running), with alerts, logs, metrics."""
    with fresh_pg_url() as url:
        tokens = setup_accounts(url)
        app = create_app(url, settings=Settings(token_cache_s=60))
        with TestClient(app) as client:
            runs = {}
            for name, token, project, end in (
                ("a_running", tokens.agent_a, "A", None),
                ("a_done", tokens.agent_a, "A", NOW - 100),
                ("b_done", tokens.agent_b, "B", NOW - 100),
                ("none_done", tokens.admin, None, NOW - 100),
                ("none_running", tokens.admin, None, None),
            ):
                extra = {"status": "succeeded", "ended_at": end, "exit_code": 0} if end else {}
                labels = {"team": "shared-team"} | ({"project": project} if project else {})
                secret = {"A": None, "B": SECRET_B, None: SECRET_NONE}[project]
                doc = run_doc(project=project, labels=labels, name=secret or f"run {name}", **extra)
                body = batch(doc, n=8, final=end is not None)
                body["events"][0]["message"] = secret or "alert of A"
                got = client.post("/api/v1/ingest", json=body, headers=bearer(token))
                assert got.status_code == 200, got.text
                log = f"log of {name} {secret or ''}".encode()
                assert (
                    client.put(f"/api/v1/runs/{doc['id']}/log", content=log, headers=bearer(token)).status_code == 200
                )
                runs[name] = doc["id"]
            yield client, tokens, runs


def _get_paths(client: TestClient) -> list[str]:
    """Every GET route of the app, in the OpenAPI document or not (dashboard pages), with its
    run parameter spelled {run_id}; routes with other parameters (static files) are left out."""
    import re

    paths = set()
    for route in client.app.routes:  # type: ignore[attr-defined]
        contexts = route.effective_route_contexts() if hasattr(route, "effective_route_contexts") else [route]
        for r in contexts:
            if "GET" in (getattr(r, "methods", None) or ()):
                paths.add(re.sub(r"\{[^}]*run[^}]*\}", "{run_id}", r.path))
    return sorted(p for p in paths if "{" not in p.replace("{run_id}", ""))


HIDDEN_FROM_A = ("b_done", "none_done", "none_running")  # what a member of A must never see


def _leaks(text: str, runs: dict[str, str], hidden: tuple[str, ...] = HIDDEN_FROM_A) -> bool:
    secrets = {SECRET_B} if "b_done" in hidden else set()
    secrets |= {SECRET_NONE} if any(h.startswith("none") for h in hidden) else set()
    return any(runs[h] in text for h in hidden) or any(s in text for s in secrets)


@pytest.mark.parametrize(
    ("hidden", "readers"),
    [("b_done", ("member_b", "member_ab", "admin")), ("none_done", ("admin",)), ("none_running", ("admin",))],
)
def test_every_run_route_answers_404_for_a_run_outside_the_scope(world, hidden, readers) -> None:  # type: ignore[no-untyped-def]
    client, t, runs = world
    paths = [p for p in _get_paths(client) if "{run_id}" in p]
    assert len(paths) >= 6, paths  # run, intervals, events, metrics, log, export (+ dashboard pages)
    unknown = str(uuid.uuid4())
    outsiders = [name for name in ("member_a", "member_b", "member_ab") if name not in readers]
    for path in paths:
        api = path.startswith("/api/")
        mine = client.get(path.replace("{run_id}", runs["a_done"]), headers=bearer(t.member_a))
        assert mine.status_code == 200, (path, mine.status_code, mine.text[:200])
        for outsider in outsiders:
            token = getattr(t, outsider)
            theirs = client.get(path.replace("{run_id}", runs[hidden]), headers=bearer(token))
            nobody = client.get(path.replace("{run_id}", unknown), headers=bearer(token))
            assert theirs.status_code == nobody.status_code, (path, outsider)
            same = theirs.text
            for n in (36, 13, 8):  # the id, and the short forms pages show
                same = same.replace(runs[hidden][:n], unknown[:n])
            same = same.replace(short_id(runs[hidden]), short_id(unknown))  # the CLI's short id of the asked id
            assert same == nobody.text, (path, outsider)  # no existence leak
            assert not _leaks(same, runs, (hidden,)), (path, outsider)  # the id it asked for aside
            if api:
                assert theirs.status_code == 404, (path, outsider)
        if api:  # those allowed see it: the other project's member, an admin
            for reader in readers:
                got = client.get(path.replace("{run_id}", runs[hidden]), headers=bearer(getattr(t, reader)))
                assert got.status_code == 200, (path, reader, got.status_code)


def test_every_listing_and_report_leaves_the_other_project_out(world) -> None:  # type: ignore[no-untyped-def]
    client, t, runs = world
    month = time.strftime("%Y-%m", time.gmtime(NOW - 3600))
    params = {"month": month, "by": "project"}
    listings = [p for p in _get_paths(client) if "{" not in p and p not in ("/openapi.json", "/docs", "/redoc")]
    for member, hidden in (("member_a", HIDDEN_FROM_A), ("member_ab", ("none_done", "none_running"))):
        for path in listings:
            got = client.get(path, headers=bearer(getattr(t, member)), params=params if "chargeback" in path else None)
            assert got.status_code < 400, (path, got.status_code, got.text[:200])  # 501 too: every route ships
            assert not _leaks(got.text, runs, hidden), (member, path)
        for by in ("project", "team", "user", "team,project"):
            got = client.get(
                "/api/v1/reports/chargeback", headers=bearer(getattr(t, member)), params={"month": month, "by": by}
            )
            assert got.status_code == 200 and not _leaks(got.text, runs, hidden), (member, by, got.status_code)
    everything = client.get("/api/v1/runs", headers=bearer(t.admin)).text
    alerts = client.get("/api/v1/alerts/recent", headers=bearer(t.admin)).text
    assert all(runs[h] in everything and runs[h] in alerts for h in HIDDEN_FROM_A)  # an admin sees them all


def test_filters_cannot_reach_around_the_scope(world) -> None:  # type: ignore[no-untyped-def]
    client, t, runs = world
    for params in (
        {"project": "B"},
        {"team": "shared-team"},
        {"user": "tester"},
        {"status": "succeeded"},
        {"since": "0"},
    ):
        rows = client.get("/api/v1/runs", headers=bearer(t.member_a), params=params).json()
        assert runs["b_done"] not in {r["id"] for r in rows}, params
    assert client.get("/api/v1/runs", headers=bearer(t.member_a), params={"project": "B"}).json() == []
    both = {r["id"] for r in client.get("/api/v1/runs", headers=bearer(t.member_ab)).json()}
    assert both == {runs["a_running"], runs["a_done"], runs["b_done"]}  # both projects, no unlabelled run
    for params in ({"status": "running"}, {"team": "shared-team"}, {"since": "0"}, {"project": ""}):
        rows = client.get("/api/v1/runs", headers=bearer(t.member_ab), params=params).json()
        assert not {runs["none_done"], runs["none_running"]} & {r["id"] for r in rows}, params
    assert client.get("/api/v1/runs", headers=bearer(t.agent_a)).json() == []  # agents write, they do not read
    # a prefix of B's id is not a way in either
    assert client.get(f"/api/v1/runs/{runs['b_done'][:8]}", headers=bearer(t.member_a)).status_code == 404


def test_writes_are_refused_outside_the_agents_projects(world) -> None:  # type: ignore[no-untyped-def]
    client, t, runs = world
    b_run = client.get(f"/api/v1/runs/{runs['b_done']}", headers=bearer(t.admin)).json()
    doc = run_doc(run_id=runs["b_done"], project="A")
    for token in (t.agent_a, t.member_a, t.member_b):
        got = client.post("/api/v1/ingest", json=batch(doc, n=1), headers=bearer(token))
        assert got.status_code in (403, 404) and SECRET_B not in got.text
    after = client.get(f"/api/v1/runs/{runs['b_done']}", headers=bearer(t.admin)).json()
    assert after == b_run | {"wall_seconds": after["wall_seconds"]}
