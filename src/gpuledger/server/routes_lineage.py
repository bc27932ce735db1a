"""``GET /api/v1/lineage/{ref}``: a model's line as ``gpuledger lineage --json`` prints it, for the
dashboard's lineage page. Limited to the caller's scope: versions and evaluations in projects the
caller cannot read are left out, and a ref that names nothing visible is 404."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool

from gpuledger.server.routes_runs import Caller, _finite, ledger_of
from gpuledger.server.scoped import ScopedLedger

router = APIRouter(prefix="/api/v1", tags=["runs"])


@router.get("/lineage/{ref}", summary="A model's line from one run id or model_version (`gpuledger lineage --json`)")
async def lineage(request: Request, principal: Caller, ref: str) -> dict[str, Any]:
    from gpuledger.reports.run import lineage as report

    ledger = ledger_of(request)
    view = ScopedLedger(ledger, principal.scope)
    try:
        model = await run_in_threadpool(report.build, view, ref, None, False, ledger)
    except report.NoLineage as exc:
        raise HTTPException(status_code=404, detail=str(exc)) from exc
    return _finite(model)
