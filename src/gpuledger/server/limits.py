"""The request guard, a plain ASGI middleware in front of every route. In this order, and before a
single byte of the body is read:

1. a NUL character in the path or query: 400 (no database can store one in text);
2. the client address's rate limit (``/healthz`` is exempt): 429 with Retry-After;
3. for the API (``/api/...`` and ``/metrics``): the token. A bad one is 401; a request that
   carries a body (POST, PUT ...) without a token is 401 too, so nobody without a token can make
   the server read anything. The principal is left in the scope's state for the routes;
4. the token's rate limit: 429 with Retry-After;
5. a declared Content-Length over the limit: 413;
6. a body (a Content-Length above 0, or Transfer-Encoding) sent to a route that takes none (any
   GET, a page, an unknown path): 404 / 405 / 413 at once, the body unread, the connection closed;
7. a write (POST, PUT, PATCH) with a token that cannot write (a member's): 403, nothing read.

Then the body. Bodies are normally read here, counted as they stream, refused as soon as they pass
the limit (413), and handed to the app in one piece, so no route starts work on a body it will not
get whole. Log uploads (``PUT .../log``) are not buffered: the route streams them to disk, and the
same limit applies as they stream (``BodyTooLarge``). Either way each chunk must come within
``body_idle_s`` and the whole body within ``body_timeout_s`` (408 otherwise, ``BodyTimeout`` for a
streaming route), so a client that trickles a body cannot hold a worker.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.concurrency import run_in_threadpool

from gpuledger.server.auth import BAD_TOKEN, MISSING_TOKEN, PRINCIPAL_KEY, Authenticator, bearer_token
from gpuledger.server.ratelimit import RateLimiter
from gpuledger.server.settings import Settings
from gpuledger.store.errors import LedgerLocked, LedgerUnavailable

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UNLIMITED_PATHS = frozenset({"/healthz"})
# The answer while the database cannot be reached: agents keep their data and retry (app.py too).
UNAVAILABLE = "the ledger database is unavailable; retry later"
STREAMED_PUT_SUFFIX = "/log"


class BodyTooLarge(Exception):
    """A streamed body passed its limit (answer 413)."""


class BodyTimeout(Exception):
    """A streamed body did not arrive in time (answer 408)."""


class Guard:
    def __init__(self, app: ASGIApp, settings: Settings, auth: Authenticator) -> None:
        self.app = app
        self.settings = settings
        self.auth = auth
        self.per_ip = RateLimiter(settings.rate_ip_per_s, settings.rate_ip_burst)
        self.per_token = RateLimiter(settings.rate_token_per_s, settings.rate_token_burst)

    def limit_for(self, path: str, method: str) -> int:
        if method == "PUT" and path.endswith(STREAMED_PUT_SUFFIX):
            return self.settings.max_log_b
        return self.settings.max_body_b

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope.get("path", ""), scope.get("method", "")
        if "\x00" in path or b"%00" in scope.get("query_string", b"").lower():
            await reply(send, 400, "NUL characters are not allowed in the path or the query")
            return
        headers = dict(scope.get("headers", []))
        if path in UNLIMITED_PATHS:
            if not (_has_body(headers) and await _no_body_here(scope, send)):
                await self.app(scope, receive, send)
            return
        client = scope.get("client") or ("unknown", 0)
        if await _limited(send, self.per_ip.take(f"ip:{client[0]}"), "this address"):
            return
        if path.startswith("/api/") or path == "/metrics":
            header = headers.get(b"authorization", b"").decode("latin-1")
            has_body = method not in ("GET", "HEAD", "OPTIONS") or b"content-length" in headers
            if header:
                token = bearer_token(header)
                try:
                    principal = None if token is None else await self._principal(token)
                except (LedgerUnavailable, LedgerLocked):  # outside the routes: their 503 handler is not here
                    await reply(send, 503, UNAVAILABLE)
                    return
                if principal is None:
                    await reply(send, 401, BAD_TOKEN if token else MISSING_TOKEN, authenticate=True)
                    return
                if await _limited(send, self.per_token.take(principal.token_id), "this token"):
                    return
                scope.setdefault("state", {})[PRINCIPAL_KEY] = principal
            elif has_body:
                await reply(send, 401, MISSING_TOKEN, authenticate=True)
                return
        limit = self.limit_for(path, method)
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await reply(send, 400, "Content-Length is not a number")
                return
            if size > limit:
                await reply(send, 413, f"request body of {size} bytes is over the limit of {limit} bytes")
                return
        if _has_body(headers) and await _no_body_here(scope, send):
            return
        caller = scope.get("state", {}).get(PRINCIPAL_KEY)
        if method in BODY_METHODS and caller is not None and caller.role not in WRITER_ROLES:  # nothing to read
            await reply(send, 403, f"role {caller.role!r} cannot write; use an agent token", close=_has_body(headers))
            return
        timed = _TimedBody(receive, limit, self.settings.body_idle_s, self.settings.body_timeout_s)
        if method == "PUT" and path.endswith(STREAMED_PUT_SUFFIX):
            await self.app(scope, timed.receive, send)  # the route streams it (and handles the two errors)
            return
        try:
            whole = await timed.read_all()
        except BodyTooLarge:
            await reply(send, 413, f"request body is over the limit of {limit} bytes")
            return
        except BodyTimeout as exc:
            await reply(send, 408, str(exc), close=True)
            return
        if whole is None:  # the client went away
            return
        await self.app(scope, _replay(whole, receive), send)

    async def _principal(self, token: str) -> Any:
        known, principal = self.auth.cached(token)
        if known:
            return principal
        return await run_in_threadpool(self.auth.principal, token)


class _TimedBody:
    """``receive`` with the size limit and both timeouts applied."""

    def __init__(self, receive: Receive, limit: int, idle_s: float, total_s: float) -> None:
        self._receive = receive
        self._limit = limit
        self._idle_s = idle_s
        self._deadline = time.monotonic() + total_s
        self._total_s = total_s
        self.seen = 0
        self.done = False

    async def receive(self) -> Message:
        if self.done:
            return await self._receive()  # after the body: wait for the disconnect, as servers do
        wait = min(self._idle_s, self._deadline - time.monotonic())
        try:
            message = await asyncio.wait_for(self._receive(), timeout=max(wait, 0.001))
        except asyncio.TimeoutError:
            raise BodyTimeout(
                f"request body not received in time (at most {self._idle_s:g} s between chunks, "
                f"{self._total_s:g} s in all)"
            ) from None
        if message["type"] == "http.request":
            self.seen += len(message.get("body", b""))
            if self.seen > self._limit:
                raise BodyTooLarge(f"request body is over the limit of {self._limit} bytes")
            self.done = not message.get("more_body", False)
        return message

    async def read_all(self) -> bytes | None:
        chunks: list[bytes] = []
        while not self.done:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
        return b"".join(chunks)


BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
WRITER_ROLES = frozenset({"admin", "agent"})  # every API write is theirs (auth.require_writer)


def _has_body(headers: dict[bytes, bytes]) -> bool:
    """The request announces a body (a Content-Length above 0, or Transfer-Encoding)."""
    declared = headers.get(b"content-length", b"0").strip()
    return b"transfer-encoding" in headers or (declared.isdigit() and int(declared) > 0) or not declared.isdigit()


async def _no_body_here(scope: Scope, send: Send) -> bool:
    """A body sent to a route that takes none (any GET, a page, an unknown path) is answered
    unread: 404 (no such path), 405 (not with this method) or 413 (this route takes no body), and
    the connection is closed, since the body was never read."""
    from starlette.routing import Match

    app = scope.get("app")
    routes = getattr(app, "routes", None)
    if routes is None:  # not under a Starlette app (a bare ASGI test): nothing to tell by
        return False
    method, path = scope.get("method", ""), scope.get("path", "")
    matches = {route.matches(scope)[0] for route in routes}
    if Match.FULL in matches and method in BODY_METHODS:  # a POST / PUT / PATCH route is there
        return False
    if Match.FULL in matches:
        await reply(send, 413, f"{method} {path} takes no request body", close=True)
    elif Match.PARTIAL in matches:
        await reply(send, 405, f"{method} is not allowed on {path}", close=True)
    else:
        await reply(send, 404, f"nothing at {path} takes a request body", close=True)
    return True


def _replay(whole: bytes, receive: Receive) -> Receive:
    delivered = False

    async def replay() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": whole, "more_body": False}
        return await receive()  # after the body: wait for the disconnect, as servers do

    return replay


async def _limited(send: Send, wait_s: float, who: str) -> bool:
    if wait_s <= 0:
        return False
    retry = max(1, math.ceil(wait_s))
    detail = f"too many requests from {who}; retry in {retry} s"
    await reply(send, 429, detail, extra=[(b"retry-after", str(retry).encode())])
    return True


async def reply(
    send: Send,
    status: int,
    detail: str,
    *,
    authenticate: bool = False,
    close: bool = False,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if authenticate:
        headers.append((b"www-authenticate", b"Bearer"))
    if close:
        headers.append((b"connection", b"close"))
    headers += extra or []
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
