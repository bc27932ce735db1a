"""Read routes of runs: list, one run (as ``gpuledger show --json``), its intervals, events,
metrics, log and export. Every answer is limited to the caller's scope; a run outside it is 404,
exactly like a run that does not exist."""

from __future__ import annotations

import math
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, Response

from gpuledger.core.model import RUN_STATUSES, RunRecord
from gpuledger.server import streaming
from gpuledger.server.auth import Principal, current_principal
from gpuledger.server.scoped import ScopedLedger
from gpuledger.store import Ledger, server_queries

router = APIRouter(prefix="/api/v1", tags=["runs"])
Caller = Annotated[Principal, Depends(current_principal)]


def ledger_of(request: Request) -> Ledger:
    return request.app.state.ledger


def _not_found(run_id: str) -> HTTPException:
    return HTTPException(status_code=404, detail=f"no run {run_id!r}")


def visible(request: Request, principal: Principal, run_id: str) -> tuple[ScopedLedger, RunRecord]:
    view = ScopedLedger(ledger_of(request), principal.scope)
    missing: Exception | None = None
    for ref in dict.fromkeys((run_id, run_id.lower())):  # run ids are lower-case: capitals name the same run
        try:
            return view, view.get_run(ref)
        except Exception as exc:
            missing = exc
    raise _not_found(run_id) from missing


def _finite(value: Any) -> Any:
    """JSON has no NaN: a NaN metric or reading becomes the string "NaN" (as the CLI's JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def parse_since(text: str | None) -> float | None:
    if text is None or text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        from gpuledger.runs.view import parse_since as parse

        try:
            return parse(text)
        except ValueError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from exc
    if not math.isfinite(value):
        raise HTTPException(status_code=422, detail="since must be a finite number, a date or 3d / 12h / 30m")
    return value


@router.get("/runs", summary="Runs visible to the caller, newest first")
def list_runs(
    request: Request,
    principal: Caller,
    project: str | None = None,
    team: str | None = None,
    user: str | None = None,
    status: Literal["running", "succeeded", "failed", "killed", "lost", "imported", "discovered"] | None = None,
    since: Annotated[str | None, Query(description="epoch seconds, a date, or 3d / 12h / 30m")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> list[dict[str, Any]]:
    assert status is None or status in RUN_STATUSES
    since_t = parse_since(since)
    ledger = ledger_of(request)
    tiered = ledger.series_reads is not None  # serve --series: tiered and dropped days count too

    def tx(conn: Any) -> tuple[list[RunRecord], dict[str, tuple[int, float | None]]]:
        runs = server_queries.list_runs(
            conn, principal.scope, project=project, team=team, user=user, status=status, since=since_t, limit=limit
        )
        return runs, server_queries.busy_by_run(conn, [r.id for r in runs], tiered=tiered)

    runs, busy = ledger.database.read(tx)
    now = time.time()
    from gpuledger.runs.view import run_row

    return [run_row(run, *busy.get(run.id, (0, None)), now) for run in runs]


@router.get("/runs/{run_id}", summary="One run: the same JSON as `gpuledger show --json`")
def show_run(request: Request, principal: Caller, run_id: str) -> dict[str, Any]:
    from gpuledger.reports.run import epochs as epochs_report
    from gpuledger.runs.view import summary

    view, run = visible(request, principal, run_id)
    data = summary(view, run)
    data.update(epochs_report.show_json(view, run))
    return _finite(data)


@router.get(
    "/runs/{run_id}/intervals",
    summary="A run's GPU and host intervals (export columns), oldest first, a page at a time",
    responses={200: {"content": {"application/json": {}}}, 429: {"description": "too many streams at once"}},
)
async def run_intervals(
    request: Request,
    principal: Caller,
    run_id: str,
    after_t: Annotated[float | None, Query(description="only intervals ending after this (epoch s)")] = None,
    limit: Annotated[int, Query(ge=1, le=100_000, description="rows per series (at most max_page)")] = 10_000,
) -> Response:
    from gpuledger.reports.run.export import COLUMN_NAMES

    if after_t is not None and not math.isfinite(after_t):
        raise HTTPException(status_code=422, detail="after_t must be a finite number")
    settings = request.app.state.settings
    _, run = await run_in_threadpool(visible, request, principal, run_id)
    limit = min(limit, settings.max_page)
    ledger = ledger_of(request)
    db = ledger.database
    # Raw days tiered into the server's series store (serve --series): SQL misses them, so the run
    # is read whole through the ledger, each page alike (docs/SCALE.md, "Tiering").
    tiered = await run_in_threadpool(ledger.tiered, run.id)

    def rows(series: str) -> Any:
        if tiered:
            return lambda: server_queries.tiered_interval_rows(
                ledger, run.id, series=(series,), after_t=after_t, limit=limit
            )
        q = server_queries.interval_export_query(run.id, COLUMN_NAMES, series=(series,), after_t=after_t, limit=limit)
        return lambda: server_queries.stream(db, q, settings.stream_rows)

    parts = streaming.pages_parts([("gpu", rows("gpu")), ("host", rows("host"))])
    return await streaming.respond(request, parts, "application/json")


@router.get("/runs/{run_id}/events", summary="A run's events in order")
def run_events(request: Request, principal: Caller, run_id: str) -> list[dict[str, Any]]:
    from gpuledger.store import schema

    _, run = visible(request, principal, run_id)
    e = schema.events.c
    import sqlalchemy as sa

    q = sa.select(e.seq, e.t, e.kind, e.message, e.payload).where(e.run_id == run.id).order_by(e.seq)
    return _finite([dict(r) for r in ledger_of(request).read(lambda c: list(c.execute(q).mappings()))])


@router.get("/runs/{run_id}/metrics", summary="A run's training metrics in order")
def run_metrics(request: Request, principal: Caller, run_id: str) -> list[dict[str, Any]]:
    view, run = visible(request, principal, run_id)
    return _finite(
        [{"t": m.t, "key": m.key, "value": m.value, "epoch": m.epoch, "step": m.step} for m in view.metrics(run.id)]
    )


@router.get("/runs/{run_id}/quarantine", summary="Rows of the run's pushes that were refused one by one, and why")
def run_quarantine(
    request: Request, principal: Caller, run_id: str, limit: Annotated[int, Query(ge=1, le=1000)] = 1000
) -> list[dict[str, Any]]:
    from gpuledger.store import quarantine

    _, run = visible(request, principal, run_id)
    return ledger_of(request).read(lambda c: quarantine.for_run(c, run.id, limit))


@router.get(
    "/runs/{run_id}/log",
    summary="A run's archived (redacted) output",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {}}}, 429: {"description": "too many streams at once"}},
)
async def run_log(request: Request, principal: Caller, run_id: str) -> Response:
    from gpuledger.store import log_stream

    _, run = await run_in_threadpool(visible, request, principal, run_id)
    found = await run_in_threadpool(log_stream.open_log, ledger_of(request).database, run.id)
    if found is None:
        raise HTTPException(status_code=404, detail=f"run {run.id} has no archived log")
    info, pieces = found  # read and decompressed a piece at a time, counted under max_streams
    headers = {"X-Content-Type-Options": "nosniff", "Content-Length": str(info.size_b)}
    return await streaming.respond(request, pieces, "text/plain; charset=utf-8", headers)


@router.get(
    "/runs/{run_id}/export",
    summary="A run's interval time series as CSV or JSON Lines (columns: docs/EXPORT.md), streamed",
    response_class=PlainTextResponse,
    responses={
        200: {"content": {"text/csv": {}, "application/x-ndjson": {}}},
        429: {"description": "too many streams at once"},
    },
)
async def run_export(
    request: Request, principal: Caller, run_id: str, format: Literal["csv", "jsonl"] = "csv"
) -> Response:
    from gpuledger.reports.run.export import COLUMN_NAMES

    settings = request.app.state.settings
    _, run = await run_in_threadpool(visible, request, principal, run_id)
    ledger = ledger_of(request)
    if await run_in_threadpool(ledger.tiered, run.id):  # raw days in the series store: read whole
        rows: Any = server_queries.tiered_interval_rows(ledger, run.id)
    else:
        query = server_queries.interval_export_query(run.id, COLUMN_NAMES)
        rows = server_queries.stream(ledger.database, query, settings.stream_rows)
    if format == "csv":
        parts = streaming.csv_parts(rows, list(COLUMN_NAMES))
        return await streaming.respond(request, parts, "text/csv; charset=utf-8")
    return await streaming.respond(request, streaming.jsonl_parts(rows), "application/x-ndjson")
