"""The lineage on the team server: ``GET /api/v1/lineage/{ref}`` limited to the caller's projects, and
the dashboard's lineage page in a real headless Chromium (issue 37)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from browser_support import need_browser
from dashboard_support import shot, uvicorn_server, wait_js, watch
from gpuledger.server.app import create_app
from gpuledger.store import Ledger, accounts
from server_support import bearer, devices_doc, gpu_rows, run_doc, setup_accounts
from test_lineage_store import EVAL_META, IDS, METAS, STARTS

EVIL = "<img src=x onerror=alert(1)>"


def _push(client: TestClient, token: str, name: str, meta: dict, project: str = "A") -> None:
    doc = run_doc(IDS[name], project=project, started_at=STARTS[name], meta=meta, name=f"{name} {EVIL}")
    body = {"run": doc, "gpu_intervals": gpu_rows(2, start=STARTS[name])}
    got = client.post("/api/v1/ingest", json=body, headers=bearer(token))
    assert got.status_code == 200, got.text


def test_lineage_api_is_limited_to_the_callers_projects(ledger_url: str) -> None:
    t = setup_accounts(ledger_url)
    with TestClient(create_app(ledger_url)) as client:
        for name in ("v1", "v2", "v3"):
            _push(client, t.agent_a, name, METAS[name])
        _push(client, t.agent_b, "ev", EVAL_META, project="B")  # an evaluation of v2 in project B

        def get(token: str, ref: str):  # type: ignore[no-untyped-def]
            return client.get(f"/api/v1/lineage/{ref}", headers=bearer(token))

        both = get(t.member_ab, "v3").json()
        assert [v["model_version"] for v in both["versions"]] == ["v1", "v2", "v3"]
        assert [e["run_id"] for e in both["versions"][1]["evaluations"]] == [IDS["ev"]]
        only_a = get(t.member_a, "v2").json()
        assert [v["model_version"] for v in only_a["versions"]] == ["v1", "v2", "v3"]
        assert only_a["versions"][1]["evaluations"] == []  # project B's evaluation is not shown
        assert get(t.member_b, "v2").status_code == 404  # the versions are all in project A
        assert get(t.member_b, IDS["ev"]).status_code == 404  # its training is not visible either
        assert get(t.member_a, "nothing").status_code == 404
        assert client.get("/api/v1/lineage/v2").status_code == 401


def test_lineage_page_in_chromium(tmp_path: Path) -> None:
    sync_playwright = need_browser()
    db = f"sqlite:///{tmp_path}/server.db"
    with Ledger(db) as ledger:
        _, admin = accounts.issue_token(ledger, "admin", role="admin", actor="test", create_user=True)
        accounts.add_project(ledger, "A", actor="test")
        _, agent = accounts.issue_token(ledger, "node", role="agent", actor="test", create_user=True, projects=["A"])
    with uvicorn_server(db, tmp_path / "server.log") as base, sync_playwright() as p:
        import httpx

        for name in ("v1", "v2", "v3"):
            doc = run_doc(IDS[name], started_at=STARTS[name], meta=METAS[name], name=f"{name} {EVIL}")
            body = {
                "run": doc,
                "devices": devices_doc(1, doc["host"]),
                "gpu_intervals": gpu_rows(2, start=STARTS[name]),
            }
            got = httpx.post(base + "/api/v1/ingest", json=body, headers=bearer(agent), timeout=30)
            assert got.status_code == 200, got.text
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium",
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        problems = watch(page, base)
        page.goto(base + "/dashboard/")
        page.wait_for_url("**/dashboard/login?next=*")
        page.fill("#token", admin)
        page.click("#login-form button[type=submit]")
        page.wait_for_url(base + "/dashboard/")
        page.goto(base + "/dashboard/lineage/v2")
        wait_js(page, "window.gpuledgerLineage && window.gpuledgerLineage.done", what="the lineage page")
        assert page.evaluate("window.gpuledgerLineage.versions") == 3, (problems, page.evaluate("GL.errors"))
        text = page.inner_text("#versions")
        assert "v1" in text and "v2 *" in text and "v3" in text and EVIL in text  # names stay text
        assert "NVIDIA A100-SXM4-80GB" in text and "kWh" in text
        assert page.inner_text("#lineage-title") == "Lineage of yolov8n"
        assert page.evaluate("document.querySelectorAll('main img, main script').length") == 0
        shot(page, "lineage.png")
        browser.close()
    assert problems == [], problems


@pytest.mark.parametrize("ref", ["v2", "v1.0_ft", IDS["v1"]])
def test_lineage_page_shell_has_the_csp(ref: str, tmp_path: Path) -> None:
    with Ledger(f"sqlite:///{tmp_path}/l.db"), TestClient(create_app(f"sqlite:///{tmp_path}/l.db")) as client:
        got = client.get(f"/dashboard/lineage/{ref}")
        assert got.status_code == 200 and "script-src 'self'" in got.headers["content-security-policy"]
        assert client.get("/dashboard/lineage/a%20b").status_code == 404
