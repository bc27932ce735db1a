"""The agent's ``/metrics`` endpoint: a small threaded HTTP server answering Prometheus' text format.

prometheus_client's own server would answer OpenMetrics to a Prometheus that asks for it, and its
text writer names every counter's ``# TYPE`` line ``<name>_total``; dcgm-exporter's energy counter
has no such suffix (node/dcgm_names.py). So this server always answers text format 0.0.4, with the
header lines of those counters under their exact names, as dcgm-exporter's own /metrics reads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, generate_latest

from gpuledger.node.dcgm_names import UNSUFFIXED_COUNTERS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape every few seconds is no news


def exposition(registry: CollectorRegistry) -> bytes:
    text = generate_latest(registry)
    for name in UNSUFFIXED_COUNTERS:
        text = text.replace(f"# HELP {name}_total ".encode(), f"# HELP {name} ".encode(), 1)
        text = text.replace(f"# TYPE {name}_total counter\n".encode(), f"# TYPE {name} counter\n".encode(), 1)
    return text


def metrics_app(registry: CollectorRegistry) -> Callable[..., Iterable[bytes]]:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found: /metrics is here\n"]
        body = exposition(registry)
        start_response("200 OK", [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body)))])
        return [] if environ.get("REQUEST_METHOD") == "HEAD" else [body]

    return app


def start_text_server(collector: object, port: int, host: str) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``collector`` (prometheus_client's collector protocol) on host:port in a daemon thread;
    OSError when it cannot bind. Stop with ``server.shutdown()`` and ``server.server_close()``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    server = make_server(host, port, metrics_app(registry), server_class=_Server, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, name="gpuledger-metrics", daemon=True)
    thread.start()
    return server, thread
