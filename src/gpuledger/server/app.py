"""The team server's ASGI app: ``create_app(db_url)``.

Stateless: everything lives in the database, so any number of replicas (processes, hosts) can
serve one PostgreSQL ledger behind a load balancer. The app never migrates the schema on its own
(``migrate=True`` is for tests and one-off tools); with an outdated schema it refuses to start and
says to run ``gpuledger db migrate``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Coroutine
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from gpuledger import __version__
from gpuledger.series.open import POSTGRES_SCHEMES
from gpuledger.server.auth import Authenticator
from gpuledger.server.limits import UNAVAILABLE, Guard
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, LedgerLocked, LedgerUnavailable

OPENAPI_PATH = "/openapi.json"


def _optional_routers(app: FastAPI) -> None:
    """Routers other modules provide, included when they are installed."""
    try:
        from gpuledger.server.metrics_route import router as metrics_router
    except ImportError:
        pass
    else:
        app.include_router(metrics_router)
    try:
        from gpuledger.server.dashboard import router as dashboard_router
    except ImportError:
        pass
    else:
        app.include_router(dashboard_router)


def create_app(db_url: str, *, migrate: bool = False, settings: Settings | None = None) -> FastAPI:
    """The API app over the ledger at ``db_url``.

    ``app.state``: ``ledger`` (Ledger), ``settings``, ``auth`` (token -> Principal, cached).
    """
    from gpuledger.server import (
        api_docs,
        checkpoint_keeper,
        routes_capacity,
        routes_lineage,
        routes_misc,
        routes_runs,
        routes_value,
        routes_write,
    )

    settings = settings or Settings()
    # with series_live, each push's intervals are written into settings.series (store/series_live.py)
    live = _live_series(settings)
    # SchemaOutdated unless migrated (gpuledger db migrate); tiered days read back from settings.series
    ledger = Ledger(db_url, migrate=migrate, series=live.reader if live else settings.series)
    keeper = checkpoint_keeper.from_env(ledger, settings)  # the audit checkpoint outside the database

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        sweeper = asyncio.create_task(_sweep_forever(ledger, settings)) if settings.lost_after_s > 0 else None
        keep_days = ledger.dialect == "postgresql" and settings.partition_every_s > 0
        if keep_days:  # before the first request: a read planned while strays move could miss them
            await _maintain_partitions(ledger, settings.series, compact=False)
        inflight: set[asyncio.Future[None]] = set()  # maintenance passes running in a worker thread
        partitioner = asyncio.create_task(_partition_forever(ledger, settings, inflight)) if keep_days else None
        async with checkpoint_keeper.keeping(keeper):
            yield
        for task in (sweeper, partitioner):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        # A cancelled await leaves its thread running: a pass under way ends before the server does,
        # so no index rebuild of a stopped server overlaps the next process's work on the store.
        await asyncio.gather(*inflight, return_exceptions=True)
        ledger.close()
        if live is not None:
            live.close()

    app = FastAPI(
        lifespan=lifespan,
        title="gpuledger team server",
        version=__version__,
        openapi_url=OPENAPI_PATH,
        docs_url=None,  # FastAPI's pages load scripts from a CDN: api_docs.py serves /docs instead
        redoc_url=None,
        description="Runs, intervals, metrics, events and logs of GPU training runs; docs/SERVER.md.",
    )
    app.state.ledger = ledger
    app.state.settings = settings
    app.state.series_live = live
    app.state.auth = Authenticator(ledger, settings.token_cache_s, settings.token_cache_size)
    app.state.rate_card = None
    app.include_router(routes_misc.health)
    app.include_router(routes_misc.router)
    app.include_router(routes_runs.router)
    app.include_router(routes_write.router)
    app.include_router(routes_capacity.router)  # a node's capacity intervals (docs/CAPACITY.md)
    app.include_router(routes_value.router)  # value for money by week, for the dashboard
    app.include_router(routes_lineage.router)  # a model's line, for the dashboard's lineage page
    app.include_router(api_docs.router)
    _optional_routers(app)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in exc.errors()]
        return JSONResponse(status_code=422, content={"detail": errors[:20]})

    @app.exception_handler(LedgerUnavailable)
    @app.exception_handler(LedgerLocked)
    async def _unavailable(_request: Request, exc: Exception) -> JSONResponse:
        # 503: agents keep their data and retry; a load balancer may try another replica.
        return JSONResponse(status_code=503, content={"detail": UNAVAILABLE})

    @app.exception_handler(sa.exc.DataError)
    async def _unstorable(_request: Request, exc: Exception) -> JSONResponse:
        first = str(getattr(exc, "orig", exc)).strip().splitlines()[0][:200]
        return JSONResponse(status_code=422, content={"detail": f"a value cannot be stored: {first}"})

    _add_ingest_schema(app)
    app.add_middleware(checkpoint_keeper.Halt, keeper=keeper)  # a shortened audit trail: 503, inside the guard
    app.add_middleware(Guard, settings=settings, auth=app.state.auth)
    return app


def one_line(exc: BaseException) -> str:
    """A background task's failure for the server's log: the driver's first line (SQLAlchemy adds
    the statement and a link on lines of their own), with the error's class when it says nothing."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _live_series(settings: Settings) -> Any:
    """The store pushes are written into (``serve --series URL --series-live``), or None."""
    if not (settings.series_live or settings.series_only):
        return None
    if not settings.series:
        raise ValueError("series_live (GPULEDGER_SERIES_LIVE) writes into the series store: give series (--series URL)")
    from gpuledger.store.series_live import LiveSeries

    return LiveSeries(settings.series, batch_rows=settings.series_batch_rows, batch_ms=settings.series_batch_ms)


async def _maintain_partitions(ledger: Ledger, series: str | None = None, *, compact: bool = True) -> None:
    """PostgreSQL: the raw tables' day partitions from yesterday to two days ahead, and strays moved
    out of the default partitions (store/partitions.py); with ``--series`` on a compact PostgreSQL
    store, that store's own days ahead and closed days' indexes (store/series_window.py)."""
    from gpuledger.store import partitions

    try:
        await run_in_threadpool(partitions.maintain, ledger.database)
    except Exception as exc:  # a lock held too long or the database away: next time (rows land in DEFAULT)
        logging.getLogger("gpuledger.server").warning("partition maintenance failed: %s", one_line(exc))
    if series and urlsplit(series).scheme.lower() in POSTGRES_SCHEMES:
        try:
            await run_in_threadpool(_maintain_series, series, compact)
        except Exception as exc:  # the store away or not created yet (retention run --series creates it)
            logging.getLogger("gpuledger.server").warning("series store maintenance failed: %s", one_line(exc))


def _maintain_series(url: str, compact: bool = True) -> None:
    """On a connection of its own: the store the ledger reads from is not shared across threads."""
    from gpuledger.store import series_tier, series_window

    store = series_tier.open_store(url, create=False)
    try:
        series_window.maintain(store, compact=compact)
    finally:
        store.close()


async def _partition_forever(ledger: Ledger, settings: Settings, inflight: set[asyncio.Future[None]]) -> None:
    """The maintenance every partition_every_s after the one at start (which the lifespan awaits
    without the series store's index rebuilds: those run here at once, while the server serves).
    Each pass is listed in ``inflight`` while it runs, so that a stopping server waits for it."""

    async def step(work: Coroutine[Any, Any, None]) -> None:
        fut = asyncio.ensure_future(work)
        inflight.add(fut)
        fut.add_done_callback(inflight.discard)
        await asyncio.shield(fut)

    if settings.series and urlsplit(settings.series).scheme.lower() in POSTGRES_SCHEMES:
        await step(_compact_series(settings.series))
    while True:
        await asyncio.sleep(settings.partition_every_s)
        await step(_maintain_partitions(ledger, settings.series))


async def _compact_series(url: str) -> None:
    try:
        await run_in_threadpool(_maintain_series, url, True)
    except Exception as exc:  # e.g. chosen as a deadlock's victim: the next hourly pass tries again
        logging.getLogger("gpuledger.server").warning("series store maintenance failed: %s", one_line(exc))


async def _sweep_forever(ledger: Ledger, settings: Settings) -> None:
    """Mark runs whose agent went silent as lost (store/liveness_sweep.py), every sweep_every_s."""
    from gpuledger.store import liveness_sweep

    await asyncio.sleep(settings.sweep_delay_s)
    while True:
        try:
            await run_in_threadpool(liveness_sweep.sweep, ledger.database, lost_after_s=settings.lost_after_s)
        except Exception as exc:  # the database may be away for a while: try again next time
            logging.getLogger("gpuledger.server").warning("liveness sweep failed: %s", one_line(exc))
        await asyncio.sleep(settings.sweep_every_s)


def _add_ingest_schema(app: FastAPI) -> None:
    from gpuledger.server.routes_write import openapi_components

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(openapi_components())
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def app_from_env() -> FastAPI:
    """For ``uvicorn --factory gpuledger.server.app:app_from_env`` (``gpuledger serve`` uses it):
    the database URL comes from GPULEDGER_SERVER_DB, the settings from GPULEDGER_<FIELD>
    variables (settings.py)."""
    url = os.environ.get("GPULEDGER_SERVER_DB", "")
    if not url:
        raise SystemExit("set GPULEDGER_SERVER_DB to the ledger URL (gpuledger serve does)")
    return create_app(url, settings=Settings.from_env())
