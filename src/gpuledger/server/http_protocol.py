"""uvicorn's HTTP/1.1 protocol with a deadline for the request line and headers.

uvicorn closes a keep-alive connection that stays idle, but a client that opens a connection and
sends its headers a byte at a time (or nothing at all) holds it for as long as it likes: one such
client per connection slot and the server stops answering. Here a timer starts when a connection
opens and when the first byte of each request arrives, and stops when the headers are complete; if
it fires, the client gets ``408 Request Timeout`` and the connection is closed. The body has its own
timeouts (limits.py).

``gpuledger serve`` passes ``TimedHttpProtocol`` to uvicorn (``http=``); the deadline is
``GPULEDGER_HEADER_TIMEOUT_S`` seconds (default 10), read when the class is imported in each worker.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from gpuledger.server.settings import HEADER_TIMEOUT_ENV, Settings

_BODY = b"request line and headers not received in time\n"
_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
_408 += b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_BODY), _BODY)


def header_timeout_s() -> float:
    text = os.environ.get(HEADER_TIMEOUT_ENV, "")
    try:
        return float(text) if text else Settings.header_timeout_s
    except ValueError:
        raise SystemExit(f"{HEADER_TIMEOUT_ENV}={text!r}: expected a number of seconds") from None


class _HeaderDeadline:
    """Mixin: ``_arm`` on connection and request start, ``_disarm`` when the headers are in."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    _header_timer: asyncio.TimerHandle | None = None
    header_timeout_s = header_timeout_s()

    def _arm(self) -> None:
        if self._header_timer is None and self.header_timeout_s > 0:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.write(_408)
            self.transport.close()


def _httptools_protocol() -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class TimedHttpToolsProtocol(_HeaderDeadline, HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

    return TimedHttpToolsProtocol


def _h11_protocol() -> type[asyncio.Protocol]:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedH11Protocol(_HeaderDeadline, H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is h11.IDLE:  # a request begun, its headers not complete yet
                self._arm()
            else:
                self._disarm()

    return TimedH11Protocol


def _pick() -> Any:
    try:
        import httptools  # noqa: F401
    except ImportError:
        return _h11_protocol()
    return _httptools_protocol()


TimedHttpProtocol = _pick()
