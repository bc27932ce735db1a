"""Write routes: ``POST /api/v1/ingest`` (agent pushes) and ``PUT /api/v1/runs/{id}/log``.

The ingest body is read raw and checked by batch_check.py: the run record must be valid (else 422,
nothing stored), each row is judged on its own, and the rows that fail are quarantined and listed
in the answer while the rest is stored (partial acceptance). What is stored is redacted again on
the server (redaction.py). Writers are admins and agents; an agent writes only runs whose
``project`` label is one of its projects (403), and a run that exists in a project it may not
write is answered 404, as if it did not exist.
"""

from __future__ import annotations

import os
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool

from gpuledger.core.model import RunRecord
from gpuledger.runs.logfile import cap_or_default
from gpuledger.server import batch_check, log_upload
from gpuledger.server.auth import Principal, current_principal, require_writer
from gpuledger.server.models import IngestBatch, IngestResult, QuarantinedItem
from gpuledger.server.redaction import redact_batch, redact_refused, redactor
from gpuledger.server.rows import GPU_COLUMNS, HOST_COLUMNS, gpu_tuple, host_tuple
from gpuledger.store import closed_months, quarantine, series_live, series_segments, server_queries
from gpuledger.store import ingest as store_ingest

router = APIRouter(prefix="/api/v1", tags=["ingest"])
Caller = Annotated[Principal, Depends(current_principal)]

_BATCH_SCHEMA = IngestBatch.model_json_schema(ref_template="#/components/schemas/{model}")
_DEFS = _BATCH_SCHEMA.pop("$defs", {})


def openapi_components() -> dict[str, Any]:
    """Schemas referenced by the ingest request body (merged into the OpenAPI document)."""
    return {**_DEFS, "IngestBatch": _BATCH_SCHEMA}


def _authorize_fn(principal: Principal) -> Any:
    def authorize(existing_project: str | None, new_project: str | None) -> None:
        # Called with existing_project=None for a new run; for an existing run, the run's current
        # project must be writable too, else it "does not exist" for this caller.
        if existing_project is not None and not principal.can_write(existing_project):
            raise store_ingest.NotYours
        if not principal.can_write(new_project):
            where = f"project {new_project!r}" if new_project is not None else "a run without a project label"
            raise HTTPException(status_code=403, detail=f"this token cannot write runs of {where}")

    return authorize


def _live_write(request: Request) -> store_ingest.LiveWrite | None:
    """``serve --series-live``: the push's new intervals into the series store, before it commits."""
    live = getattr(request.app.state, "series_live", None)
    return None if live is None else live.write


def _pushing(request: Request) -> Any:
    """``serve --series-live`` on ClickHouse: a push the store's group commit waits for."""
    live = getattr(request.app.state, "series_live", None)
    return None if live is None else live.pushing


def _only(request: Request) -> str | None:
    """``serve --series-only``: the store (as shown) the runs this server creates keep their rows in."""
    live = getattr(request.app.state, "series_live", None)
    return live.shown if live is not None and request.app.state.settings.series_only else None


def _summary(request: Request) -> Any:
    """What the store holds of a series-only run, for its seal (store/series_segments.py)."""
    live = getattr(request.app.state, "series_live", None)
    return None if live is None else live.summary


def _to_run(batch: IngestBatch) -> RunRecord:
    return RunRecord(**batch.run.model_dump())


def actor_of(principal: Principal) -> str:
    return f"{principal.user} (token {principal.token_id})"


def _write(request: Request, principal: Principal, checked: batch_check.CheckedBatch) -> IngestResult:
    ledger = request.app.state.ledger
    batch = redact_batch(checked.batch)
    metrics = []
    for m in batch.metrics:
        row = m.model_dump()
        row["value"] = float(row["value"])
        metrics.append(row)
    actor = actor_of(principal)
    writer = store_ingest.Writer.of(principal)
    try:
        out = store_ingest.ingest(
            ledger.database,
            run=_to_run(batch),
            devices=[d.model_dump() for d in batch.devices],
            gpu=[*batch.gpu_rows, *map(gpu_tuple, batch.gpu_intervals)],
            host=[*batch.host_rows, *map(host_tuple, batch.host_intervals)],
            gpu_columns=GPU_COLUMNS,
            host_columns=HOST_COLUMNS,
            events=[e.model_dump() for e in batch.events],
            metrics=metrics,
            final=batch.final,
            writer=writer,
            authorize=_authorize_fn(principal),
            closed_before=closed_months.boundary(time.time(), request.app.state.settings.close_after_days),
            live=_live_write(request),
            only=_only(request),
            summary=_summary(request),
            pushing=_pushing(request),
            noted_at=time.time(),  # the run's last sign of life, noted in the push's transaction
        )
    except (series_live.SeriesUnavailable, series_segments.SeriesRequired) as exc:  # nothing kept: sent again
        retry = {"Retry-After": str(series_live.RETRY_AFTER_S)}
        raise HTTPException(status_code=503, detail=f"{exc}; nothing was stored, retry later", headers=retry) from None
    except store_ingest.NotYours:
        raise HTTPException(status_code=404, detail=f"no run {batch.run.id!r} in your projects") from None
    except store_ingest.HostRefused as exc:  # a host-bound token speaking for another host
        raise HTTPException(status_code=403, detail=str(exc)) from None
    except store_ingest.PushRefused as exc:  # would rewrite history or take another host's GPU
        raise HTTPException(status_code=409, detail=str(exc)) from None
    out_of_span = _span_refusals(batch, out.refused)
    refused = [{"series": r.series, "item": r.item, "reason": r.reason, "raw": r.raw} for r in checked.refused]
    refused += [{"series": r.series, "item": r.item, "reason": r.reason, "raw": r.raw} for r in out_of_span]
    if refused:  # one more transaction only for a push with refused rows
        quarantine.after_push(
            ledger.database, batch.run.id, redact_refused(refused), actor=actor, token_id=principal.token_id,
            redact=redactor().redact_text, note=False,
        )  # fmt: skip
    items = [
        QuarantinedItem(series=r.series, index=r.index, item=r.item, reason=r.reason)
        for r in [*checked.refused, *out_of_span]
    ]
    return IngestResult(**{k: v for k, v in out.__dict__.items() if k != "refused"}, quarantined=items)


def _span_refusals(batch: IngestBatch, refused: list[store_ingest.RefusedRow]) -> list[store_ingest.RefusedRow]:
    """The store's refusals (rows outside the run's span) named by the batch's own lists."""
    import dataclasses

    out = []
    for r in refused:
        series, index = r.series, r.index
        if series in ("gpu", "host"):
            compact = len(batch.gpu_rows if series == "gpu" else batch.host_rows)
            series, index = (f"{series}_rows", index) if index < compact else (f"{series}_intervals", index - compact)
        out.append(dataclasses.replace(r, series=series, index=index))
    return out


@router.post(
    "/ingest",
    summary="Push a run and any new intervals, events and metrics (idempotent; bad rows are quarantined)",
    response_model=IngestResult,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/IngestBatch"}}},
        }
    },
    responses={
        413: {"description": "body over the size limit, or more rows than one push may carry"},
        422: {"description": "invalid run record"},
        503: {"description": "the ledger or (serve --series-live) the series store is unavailable: nothing stored"},
    },
)
async def ingest(request: Request, principal: Caller) -> IngestResult:
    require_writer(principal)
    body = await request.body()
    try:
        checked = await run_in_threadpool(batch_check.check, body, time.time())
    except batch_check.BatchInvalid as exc:
        raise HTTPException(status_code=422, detail=exc.detail) from None
    except batch_check.TooManyRows as exc:  # the agent splits its batch and sends it again
        raise HTTPException(status_code=413, detail=str(exc)) from None
    return await run_in_threadpool(_write, request, principal, checked)


_LOG_BODY = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


@router.put(
    "/runs/{run_id}/log",
    summary="Store a run's log (redacted again as it streams in); raw bytes in the body",
    openapi_extra={"requestBody": {"required": True, "content": _LOG_BODY}},
    responses={408: {"description": "the body stalled"}, 413: {"description": "log over the size limit"}},
)
async def put_log(request: Request, principal: Caller, run_id: str) -> dict[str, Any]:
    require_writer(principal)
    run_id = run_id.lower()  # the canonical form of a run id (wire_types.RunId)
    ledger = request.app.state.ledger
    exists, project = await run_in_threadpool(ledger.read, lambda c: server_queries.run_project(c, run_id))
    if not exists or not principal.can_write(project):  # before a byte of the log is read
        raise HTTPException(status_code=404, detail=f"no run {run_id!r} in your projects")
    upload = await log_upload.receive(request)  # streamed to disk, redacted, body limit (413 / 408)
    # X-Gpuledger-Log-Truncated is not read: whether the log is cut is what the server finds (its
    # own cut under the ledger's cap, or the agent's marker in the log).

    def authorize(project: str | None) -> None:
        if not principal.can_write(project):
            raise store_ingest.NotYours

    def write(data: bytes, truncated: bool) -> bool:
        writer = store_ingest.Writer.of(principal)
        return store_ingest.set_log(
            ledger.database, run_id=run_id, data=data, truncated=truncated, writer=writer, authorize=authorize
        )

    cap_b = cap_or_default(os.environ)  # the ledger's cap (GPULEDGER_LOG_MAX_B), as the agent's
    try:
        found = await upload.store(write, cap_b)  # a few at a time: each holds at most cap_b in memory
    except store_ingest.NotYours:
        found = False
    except store_ingest.HostRefused as exc:
        raise HTTPException(status_code=403, detail=str(exc)) from None
    except store_ingest.PushRefused as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from None
    if not found:
        raise HTTPException(status_code=404, detail=f"no run {run_id!r} in your projects")
    return {"run_id": run_id, "size_b": upload.size_b, "sha256": upload.sha256, "truncated": upload.truncated}
