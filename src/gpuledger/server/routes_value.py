"""``GET /api/v1/reports/value-trends``: value for money week by week, for the dashboard's overview.

The same figures as the chargeback HTML's value sections (reports/cost/value_trends.py): cost,
cost per mAP point and per epoch per model version and ISO week, the TOP lists and the anomalies
of the last complete week with their likely causes (by model_version also the versions
evaluated slower than their previous version on the same data and hardware), for the caller's projects only.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request

from gpuledger.server.routes_misc import Caller, _rate_card
from gpuledger.server.routes_runs import _finite

router = APIRouter(prefix="/api/v1", tags=["misc"])


@router.get("/reports/value-trends", summary="Value for money by week: trend, TOP lists, anomalies and causes")
def value_trends(
    request: Request,
    principal: Caller,
    month: Annotated[
        str | None, Query(pattern=r"^\d{4}-\d{2}$", description="YYYY-MM (UTC): its weeks to date, eight at least")
    ] = None,
    by: Literal["model_version", "model"] = "model_version",
    weeks: Annotated[int, Query(ge=1, le=26)] = 8,
) -> dict[str, Any]:
    from gpuledger.reports.cost import costing
    from gpuledger.reports.cost.value_trends import value_trends as trends

    now = time.time()
    try:
        start, end = costing.window_from_args(month, None, None, now)
    except ValueError as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    if start >= now:
        raise HTTPException(status_code=422, detail=f"month: {month} has not begun")
    card = _rate_card(request, costing)
    vt = trends(
        request.app.state.ledger, scope=principal.scope, card=card, end=min(end, now), since=start, weeks=weeks, by=by
    )
    return _finite(vt.as_dict())
