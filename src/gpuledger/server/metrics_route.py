"""``GET /metrics``: the ledger's running and recently ended runs in Prometheus' text format, and
the value of the recently ended ones (cost, epochs, mAP gained: prom/value_source.py).

Names and labels as ``gpuledger run --metrics-port`` (docs/PROMETHEUS.md); the caller's token
decides which projects' runs appear (an admin's: all; an agent's: none). The read runs in
FastAPI's thread pool (a plain ``def`` route), one transaction per scrape; the sums are kept
between scrapes (prom/ledger_source.py), so a scrape reads only what was recorded since the last.
"""

from __future__ import annotations

import logging
import threading
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from gpuledger.core.audit.access import Principal
from gpuledger.prom.families import SnapshotCollector
from gpuledger.prom.ledger_source import LedgerSource
from gpuledger.prom.value_families import ValueCollector
from gpuledger.prom.value_source import ValueSource
from gpuledger.server.auth import current_principal

router = APIRouter(tags=["metrics"])
_create_lock = threading.Lock()
_log = logging.getLogger(__name__)


def _source(request: Request) -> LedgerSource:
    """This app's source, created at the first scrape; it keeps the sums between scrapes."""
    state = request.app.state
    with _create_lock:
        source = getattr(state, "metrics_source", None)
        if source is None:
            source = state.metrics_source = LedgerSource(state.ledger)
        return source


def _value_source(request: Request) -> ValueSource | None:
    """The value gauges' source, priced with the server's rate card (the chargeback route's);
    None, with one log line, when that card cannot be read: the other metrics still flow."""
    state = request.app.state
    with _create_lock:
        source = getattr(state, "metrics_value_source", None)
        if source is not None or getattr(state, "metrics_value_refused", False):
            return source
    from gpuledger.core.pricing.ratecard_load import RateCardError
    from gpuledger.reports.cost import costing
    from gpuledger.server.routes_misc import _rate_card

    try:
        card = _rate_card(request, costing)
    except (RateCardError, OSError) as exc:  # the card is read once per process: so is this line
        state.metrics_value_refused = True
        _log.warning("/metrics: no value gauges, the rate card cannot be read: %s", exc)
        return None
    with _create_lock:
        source = getattr(state, "metrics_value_source", None)
        if source is None:
            source = state.metrics_value_source = ValueSource(state.ledger, card)
        return source


@router.get("/metrics", response_class=Response, summary="Prometheus metrics of running and recent runs")
def metrics(request: Request, principal: Annotated[Principal, Depends(current_principal)]) -> Response:
    figures = _source(request).figures(principal.scope)
    value_source = _value_source(request)
    values = value_source.figures(principal.scope) if value_source is not None else []
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: figures))
    registry.register(ValueCollector(lambda: values))
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(content=encoder(registry), media_type=content_type)
