"""Who am I, recent alerts, the chargeback report, and a health check."""

from __future__ import annotations

import threading
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request

from gpuledger.core.chargeback.columns import GROUP_KEYS
from gpuledger.server.auth import Principal, current_principal
from gpuledger.server.routes_runs import _finite, parse_since
from gpuledger.store import server_queries

router = APIRouter(prefix="/api/v1", tags=["misc"])
health = APIRouter(tags=["misc"])
Caller = Annotated[Principal, Depends(current_principal)]
_card_lock = threading.Lock()


@health.get("/healthz", summary="Liveness and schema version (no token needed)")
def healthz(request: Request) -> dict[str, Any]:
    try:
        version = request.app.state.ledger.schema_version()
    except Exception as exc:
        raise HTTPException(status_code=503, detail=f"database unavailable: {exc.__class__.__name__}") from None
    return {"status": "ok", "schema_version": version}


@router.get("/me", summary="The caller: user, role and the projects it may reach")
def me(request: Request, principal: Caller) -> dict[str, Any]:
    return {
        "user": principal.user,
        "role": principal.role,
        "projects": None if principal.projects is None else sorted(principal.projects),
        "token_id": principal.token_id,
        # Whether the ledger holds any run at all, the caller's or not: one bit, so that a member
        # who sees none is told "none visible to you", not "no runs yet" (nothing about whose).
        "ledger_has_runs": bool(request.app.state.ledger.list_runs(limit=1)),
    }


@router.get("/alerts/recent", summary="Alert, OOM and NaN-loss events of visible runs, newest first")
def recent_alerts(
    request: Request,
    principal: Caller,
    since: Annotated[str | None, Query(description="epoch seconds, a date, or 3d / 12h / 30m")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    since_t = parse_since(since)
    rows = request.app.state.ledger.read(
        lambda c: server_queries.recent_alerts(c, principal.scope, since=since_t, limit=limit)
    )
    return _finite(rows)


def _rate_card(request: Request, costing: Any) -> Any:
    """The server's rate card, loaded once; its content is recorded in the audit chain when it
    differs from the last one recorded."""
    state = request.app.state
    with _card_lock:
        if getattr(state, "rate_card", None) is None:
            path = state.settings.rates
            card = costing.load_rate_card(path)
            text = _card_text(path)
            if text is not None:
                from gpuledger.store import audit

                audit.rate_card_changed(state.ledger, actor="server", name=card.name or "rates", text=text)
            state.rate_card = card
        return state.rate_card


def _card_text(path: str | None) -> str | None:
    if path is not None:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    try:
        from importlib import resources

        return resources.files("gpuledger.core.pricing").joinpath("default_rates.toml").read_text(encoding="utf-8")
    except (OSError, ModuleNotFoundError):
        return None


# Grouping keys of the server's chargeback: those of the cost engine, except "status", which its
# day rollups do not keep (a month's report reads them for earlier days). Filter runs by status with
# GET /runs?status= instead.
SERVER_GROUP_KEYS = tuple(k for k in GROUP_KEYS if k != "status")


@router.get("/reports/chargeback", summary="Chargeback of a month for the caller's projects")
def chargeback(
    request: Request,
    principal: Caller,
    month: Annotated[
        str | None, Query(pattern=r"^\d{4}-\d{2}$", description="YYYY-MM (UTC); default this month")
    ] = None,
    by: Annotated[
        str, Query(max_length=200, description=f"comma-separated, one or more of: {', '.join(SERVER_GROUP_KEYS)}")
    ] = "team",
    format: Literal["json"] = "json",
    include_replayed: Annotated[
        bool, Query(description="count runs metered from a replayed GPU trace (--replay-gpus), marked replayed")
    ] = False,
) -> dict[str, Any]:
    from gpuledger.reports.cost import costing  # ships with the server: a failure to import is a bug, not a 501

    keys = tuple(k.strip() for k in by.split(",") if k.strip())
    unknown = [k for k in keys if k not in SERVER_GROUP_KEYS]
    if unknown or not keys:
        why = (
            " (a run's status is not kept in the day rollups; filter runs with /runs?status=)"
            if "status" in keys
            else ""
        )
        raise HTTPException(status_code=422, detail=f"by: use one or more of {', '.join(SERVER_GROUP_KEYS)}{why}")
    try:
        start, end = costing.window_from_args(month, None, None, time.time())
    except ValueError as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    card = _rate_card(request, costing)
    cb = costing.chargeback(
        request.app.state.ledger, scope=principal.scope, card=card, start=start, end=end, by=keys,
        include_replayed=include_replayed,
    )  # fmt: skip
    return _finite(cb.as_dict())
