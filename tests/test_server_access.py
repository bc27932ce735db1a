"""Access control, endpoint by endpoint: a member of project A gets nothing of project B, whatever
the route (the API's, and any route another module adds), filter, export or aggregate report,
and a guessed run id of B looks exactly like a run that does not exist."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from server_support import NOW, Tokens, batch, bearer, fresh_pg_url, run_doc, setup_accounts

SECRET_B = "secret-of-project-B"


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[TestClient, Tokens, dict[str, str]]]:
    """Runs of A (one running, one ended) and of B, with alerts, logs, metrics."""
    with fresh_pg_url() as url:
        tokens = setup_accounts(url)
        app = create_app(url, settings=Settings(token_cache_s=60))
        with TestClient(app) as client:
            runs = {}
            for name, token, project, end in (
                ("a_running", tokens.agent_a, "A", None),
                ("a_done", tokens.agent_a, "A", NOW - 100),
                ("b_done", tokens.agent_b, "B", NOW - 100),
            ):
                extra = {"status": "succeeded", "ended_at": end, "exit_code": 0} if end else {}
                labels = {"project": project, "team": "shared-team"}
                doc = run_doc(
                    project=project, labels=labels, name=SECRET_B if project == "B" else f"run {name}", **extra
                )
                body = batch(doc, n=8, final=end is not None)
                body["events"][0]["message"] = SECRET_B if project == "B" else "alert of A"
                got = client.post("/api/v1/ingest", json=body, headers=bearer(token))
                assert got.status_code == 200, got.text
                log = f"log of {name} {SECRET_B if project == 'B' else ''}".encode()
                client.put(f"/api/v1/runs/{doc['id']}/log", content=log, headers=bearer(token))
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


def _leaks(text: str, runs: dict[str, str]) -> bool:
    return runs["b_done"] in text or SECRET_B in text


def test_every_run_route_answers_404_for_another_projects_run(world) -> None:  # type: ignore[no-untyped-def]
    client, t, runs = world
    paths = [p for p in _get_paths(client) if "{run_id}" in p]
    assert len(paths) >= 6, paths  # run, intervals, events, metrics, log, export (+ dashboard pages)
    unknown = str(uuid.uuid4())
    for path in paths:
        api = path.startswith("/api/")
        mine = client.get(path.replace("{run_id}", runs["a_done"]), headers=bearer(t.member_a))
        assert mine.status_code == 200, (path, mine.status_code, mine.text[:200])
        theirs = client.get(path.replace("{run_id}", runs["b_done"]), headers=bearer(t.member_a))
        nobody = client.get(path.replace("{run_id}", unknown), headers=bearer(t.member_a))
        assert theirs.status_code == nobody.status_code, path
        b_id = runs["b_done"]
        same = theirs.text
        for n in (36, 13, 8):  # the id, and the short forms pages show
            same = same.replace(b_id[:n], unknown[:n])
        assert same == nobody.text, path  # no existence leak
        assert SECRET_B not in theirs.text
        if api:
            assert theirs.status_code == 404, path
            # the other project's member sees it; an admin too
            for token in (t.member_b, t.admin):
                assert client.get(path.replace("{run_id}", runs["b_done"]), headers=bearer(token)).status_code == 200


def test_every_listing_and_report_leaves_the_other_project_out(world) -> None:  # type: ignore[no-untyped-def]
    client, t, runs = world
    month = time.strftime("%Y-%m", time.gmtime(NOW - 3600))
    params = {"month": month, "by": "project"}
    for path in [p for p in _get_paths(client) if "{" not in p]:
        if path in ("/openapi.json", "/docs", "/redoc"):
            continue
        got = client.get(path, headers=bearer(t.member_a), params=params if "chargeback" in path else None)
        if got.status_code == 501:
            continue  # a report whose module is not installed
        assert got.status_code < 400, (path, got.status_code, got.text[:200])
        assert not _leaks(got.text, runs), path
    for path in ("/api/v1/reports/chargeback",):
        for by in ("project", "team", "user", "team,project"):
            got = client.get(path, headers=bearer(t.member_a), params={"month": month, "by": by})
            if got.status_code != 501:
                assert got.status_code == 200 and not _leaks(got.text, runs), by


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
    assert both == set(runs.values())
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
