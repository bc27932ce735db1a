"""``GET /dashboard/...``: the page shells and their static files.

The pages carry no data and need no token (the token lives in the browser and is sent to the JSON
API), so a page load reveals nothing. Every response forbids framing and inline script; the
Content-Security-Policy only allows this server's own scripts, styles and API.
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from gpuledger import __version__
from gpuledger.core.ids import short_id
from gpuledger.core.model import RUN_STATUSES
from gpuledger.core.units import fmt_money, fmt_number, fmt_pct

PREFIX = "/dashboard"
API_PREFIX = "/api/v1"
OPENAPI_PATH = "/openapi.json"
RUN_ID = re.compile(r"^[0-9A-Za-z-]{1,64}$")
LINEAGE_REF = re.compile(r"^[0-9A-Za-z._-]{1,128}$")
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
_SCRIPTS = (
    "fmt.js", "api.js", "login.js", "overview.js", "overcharts.js", "runs.js", "run.js", "runcharts.js", "lineage.js",
)  # fmt: skip
# name -> (package, file, media type); nothing else is served.
STATIC: dict[str, tuple[str, str, str]] = {
    **{name: ("gpuledger.server.dashboard", f"static/{name}", "text/javascript; charset=utf-8") for name in _SCRIPTS},
    "dashboard.css": ("gpuledger.server.dashboard", "static/dashboard.css", "text/css; charset=utf-8"),
    "uPlot.iife.min.js": ("gpuledger.reports", "assets/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    "uPlot.min.css": ("gpuledger.reports", "assets/uPlot.min.css", "text/css; charset=utf-8"),
    "uPlot.LICENSE": ("gpuledger.reports", "assets/uPlot.LICENSE", "text/plain; charset=utf-8"),
}

router = APIRouter(prefix=PREFIX, include_in_schema=False)


@lru_cache(maxsize=1)
def _templates() -> Environment:
    folder = resources.files("gpuledger.server.dashboard").joinpath("templates")
    env = Environment(
        loader=FileSystemLoader(str(folder)),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # What a page shell shows is formatted as the CLI does; the data the browser reads from the
    # API goes through static/fmt.js, the same policy (tests/test_dashboard_numbers.py).
    env.filters.update(short_id=short_id, num=fmt_number, money=fmt_money, pct=fmt_pct)
    return env


@lru_cache(maxsize=len(STATIC))
def _static(name: str) -> bytes:
    package, path, _ = STATIC[name]
    return resources.files(package).joinpath(path).read_bytes()


def _page(request: Request, template: str, page: str, **context: Any) -> HTMLResponse:
    root = request.scope.get("root_path", "").rstrip("/")
    base = root + PREFIX
    html = (
        _templates()
        .get_template(template)
        .render(
            base=base,
            static=f"{base}/static",
            api=root + API_PREFIX,
            api_docs=root + "/docs",
            page=page,
            version=__version__,
            statuses=RUN_STATUSES,
            **context,
        )
    )
    return HTMLResponse(html, headers={**SECURITY_HEADERS, "Cache-Control": "no-store"})


@router.get("")
def dashboard_root(request: Request) -> RedirectResponse:
    root = request.scope.get("root_path", "").rstrip("/")
    return RedirectResponse(f"{root}{PREFIX}/", status_code=307)


@router.get("/", response_class=HTMLResponse)
def overview(request: Request) -> HTMLResponse:
    return _page(request, "overview.html.j2", "overview")


@router.get("/login", response_class=HTMLResponse)
def login(request: Request) -> HTMLResponse:
    return _page(request, "login.html.j2", "login")


@router.get("/runs", response_class=HTMLResponse)
def runs(request: Request) -> HTMLResponse:
    return _page(request, "runs.html.j2", "runs")


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run(request: Request, run_id: str) -> HTMLResponse:
    if not RUN_ID.match(run_id):
        raise HTTPException(status_code=404, detail="no such run")
    return _page(request, "run.html.j2", "run", run_id=run_id)


@router.get("/lineage/{ref}", response_class=HTMLResponse)
def lineage(request: Request, ref: str) -> HTMLResponse:  # a model's line: templates/lineage.html.j2
    if not LINEAGE_REF.match(ref):  # a run id or a model_version label
        raise HTTPException(status_code=404, detail="no such run or model version")
    return _page(request, "lineage.html.j2", "lineage", ref=ref)


@router.get("/static/{name}")
def static(name: str) -> Response:
    if name not in STATIC:
        raise HTTPException(status_code=404, detail="no such file")
    return Response(
        _static(name), media_type=STATIC[name][2], headers={**SECURITY_HEADERS, "Cache-Control": "public, max-age=3600"}
    )
