"""``GET /metrics``: the ledger's running and recently ended runs in Prometheus' text format.

Names and labels as ``gpuledger run --metrics-port`` (docs/PROMETHEUS.md); the caller's token
decides which projects' runs appear (an admin's: all; an agent's: none). The read runs in
FastAPI's thread pool (a plain ``def`` route), one transaction per scrape; the sums are kept
between scrapes (prom/ledger_source.py), so a scrape reads only what was recorded since the last.
"""

from __future__ import annotations

import threading
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from gpuledger.core.access import Principal
from gpuledger.prom.families import SnapshotCollector
from gpuledger.prom.ledger_source import LedgerSource
from gpuledger.server.auth import current_principal

router = APIRouter(tags=["metrics"])
_create_lock = threading.Lock()


def _source(request: Request) -> LedgerSource:
    """This app's source, created at the first scrape; it keeps the sums between scrapes."""
    state = request.app.state
    with _create_lock:
        source = getattr(state, "metrics_source", None)
        if source is None:
            source = state.metrics_source = LedgerSource(state.ledger)
        return source


@router.get("/metrics", response_class=Response, summary="Prometheus metrics of running and recent runs")
def metrics(request: Request, principal: Annotated[Principal, Depends(current_principal)]) -> Response:
    figures = _source(request).figures(principal.scope)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: figures))
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(content=encoder(registry), media_type=content_type)
