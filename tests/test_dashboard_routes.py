"""The dashboard's pages and files as served: offline, locked down, nothing outside the whitelist."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from gpuledger.server.app import create_app
from gpuledger.server.dashboard.routes import STATIC


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory):
    url = f"sqlite:///{tmp_path_factory.mktemp('dash')}/ledger.db"
    with TestClient(create_app(url, migrate=True)) as c:
        yield c


@pytest.mark.parametrize(
    "path",
    ["/dashboard/", "/dashboard/login", "/dashboard/runs", "/dashboard/runs/01900000-0000-7000-8000-000000000001"],
)
def test_pages_are_shells_with_a_strict_policy(client: TestClient, path: str) -> None:
    resp = client.get(path)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/html")
    csp = resp.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe" not in csp
    assert resp.headers["x-frame-options"] == "DENY"
    assert resp.headers["cache-control"] == "no-store"
    html = resp.text
    assert "<script>" not in html and not re.search(r"<[^>]+\son[a-z]+\s*=", html)  # no inline code
    for src in re.findall(r'(?:src|href)="([^"]+)"', html):  # every resource from this server
        assert src.startswith(("/dashboard", "/docs", "data:")), src


def test_root_redirects_to_the_overview(client: TestClient) -> None:
    resp = client.get("/dashboard", follow_redirects=False)
    assert resp.status_code == 307 and resp.headers["location"] == "/dashboard/"


def test_static_files_are_a_whitelist(client: TestClient) -> None:
    for name in STATIC:
        resp = client.get(f"/dashboard/static/{name}")
        assert resp.status_code == 200, name
        assert resp.headers["x-content-type-options"] == "nosniff"
    assert "uPlot" in client.get("/dashboard/static/uPlot.iife.min.js").text[:200]
    for bad in ["app.py", "..%2Froutes.py", "%2e%2e/routes.py", "templates", "static/api.js"]:
        assert client.get(f"/dashboard/static/{bad}").status_code == 404, bad


def test_a_run_id_that_is_not_an_id_is_404_and_never_echoed(client: TestClient) -> None:
    resp = client.get('/dashboard/runs/"><script>alert(1)<%2Fscript>')
    assert resp.status_code == 404
    assert "<script>" not in resp.text


def test_dashboard_scripts_never_write_html(client: TestClient) -> None:
    for name in STATIC:
        if name.endswith(".js") and not name.startswith("uPlot"):
            text = client.get(f"/dashboard/static/{name}").text
            for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
                assert sink not in text, (name, sink)


def test_the_api_reference_is_served_here_with_no_script(client: TestClient) -> None:
    """FastAPI's /docs would load Swagger UI from a CDN onto the origin where the dashboard keeps
    its token: the server renders its own reference instead, and the CDN pages are gone."""
    resp = client.get("/docs")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in resp.headers["content-security-policy"]
    assert "<script" not in resp.text.lower()
    assert "POST /api/v1/ingest" in resp.text and "PUT /api/v1/runs/{run_id}/log" in resp.text
    assert "after_t" in resp.text and 'href="/openapi.json"' in resp.text
    for gone in ("/redoc", "/docs/oauth2-redirect"):
        assert client.get(gone).status_code == 404, gone


def test_no_page_of_the_server_loads_anything_from_elsewhere(client: TestClient) -> None:
    paths = set()
    for route in client.app.routes:  # type: ignore[attr-defined]
        contexts = route.effective_route_contexts() if hasattr(route, "effective_route_contexts") else [route]
        paths |= {r.path for r in contexts if "GET" in (getattr(r, "methods", None) or ()) and "{" not in r.path}
    pages = []
    for path in sorted(paths):
        got = client.get(path)
        if got.headers.get("content-type", "").startswith("text/html"):
            pages.append(path)
            assert "default-src 'none'" in got.headers["content-security-policy"], path
            for ref in re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', got.text):
                assert ref.startswith(("/", "#", "data:")) and not ref.startswith("//"), (path, ref)
    assert {"/docs", "/dashboard/", "/dashboard/login"} <= set(pages)
