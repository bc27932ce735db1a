"""Request guards as a plain ASGI middleware: 413 before the app sees an oversized body, 400 for
a NUL character in the path or query (no database can store one in text).

A declared Content-Length over the limit is refused at once. Otherwise the body (chunked or not)
is read here, counted as it streams, refused as soon as it passes the limit, and handed to the app
in one piece, so no route ever starts work on a body it will not get whole.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyLimit:
    """``default_b`` for every request; ``put_suffixes`` maps a PUT path suffix to its own limit."""

    def __init__(self, app: ASGIApp, default_b: int, put_suffixes: dict[str, int] | None = None) -> None:
        self.app = app
        self.default_b = default_b
        self.put_suffixes = put_suffixes or {}

    def limit_for(self, path: str, method: str) -> int:
        if method == "PUT":
            for suffix, limit in self.put_suffixes.items():
                if path.endswith(suffix):
                    return limit
        return self.default_b

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if "\x00" in scope.get("path", "") or b"%00" in scope.get("query_string", b"").lower():
            await reply(send, 400, "NUL characters are not allowed in the path or the query")
            return
        limit = self.limit_for(scope.get("path", ""), scope.get("method", ""))
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await reply(send, 400, "Content-Length is not a number")
                    return
                if declared > limit:
                    await reply(send, 413, f"request body of {declared} bytes is over the limit of {limit} bytes")
                    return
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            seen += len(body)
            if seen > limit:
                await reply(send, 413, f"request body is over the limit of {limit} bytes")
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as servers do

        await self.app(scope, replay, send)


async def reply(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
