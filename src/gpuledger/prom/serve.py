"""``gpuledger run --metrics-port``: serve ``/metrics`` from the recording process itself.

A small threaded HTTP server (prometheus_client's) with its own registry holding only this run's
collector: no process metrics, no global registry. Failing to bind is one line on stderr; the
training runs on unmetered by Prometheus but still recorded in the ledger.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuledger.prom.live import LiveRun

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

DEFAULT_HOST = "127.0.0.1"


class MetricsServer:
    """The exporter of one recording run: ``live.observe`` is the Recorder's ``on_interval`` hook."""

    def __init__(self, live: LiveRun, server: WSGIServer, thread: threading.Thread) -> None:
        self.live = live
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._server.shutdown()
            self._server.server_close()
        self._thread.join(timeout=5)


def start(port: int, host: str = DEFAULT_HOST) -> MetricsServer:
    """Serve /metrics on ``host:port`` (``port`` 0 picks a free one); raises OSError when it cannot bind
    and ImportError without prometheus-client (pip install 'gpuledger[prometheus]')."""
    from prometheus_client import CollectorRegistry, start_http_server

    from gpuledger.prom.families import SnapshotCollector

    live = LiveRun()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(live.snapshot))
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(live, server, thread)


def try_start(port: int, host: str, warn: Callable[[str], None]) -> MetricsServer | None:
    """Like ``start``, but a busy port, a bad address or a missing library is a warning, never an error
    (CMD is already running when this is called)."""
    try:
        return start(port, host)
    except ImportError:
        warn(
            "gpuledger: --metrics-port needs prometheus-client (pip install 'gpuledger[prometheus]'); "
            "the run is recorded without a metrics endpoint"
        )
    except (OSError, ValueError) as exc:
        warn(f"gpuledger: cannot serve Prometheus metrics on {host}:{port} ({exc}); the run is recorded without")
    return None
