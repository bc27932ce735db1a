"""Who is calling: ``Authorization: Bearer <token>`` -> Principal, for every route.

``current_principal`` is the FastAPI dependency every route takes (the dashboard and /metrics
routers too). Tokens are looked up in the ledger (accounts.authenticate: constant-time compare of
the secret's sha256) and the result is cached per token for ``Settings.token_cache_s`` seconds, so
a revoked token stops working on every replica within that time.
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import TYPE_CHECKING

from fastapi import HTTPException, Request

from gpuledger.core.access import Principal
from gpuledger.store import accounts

if TYPE_CHECKING:
    from gpuledger.store import Ledger

__all__ = ["Authenticator", "Principal", "current_principal", "require_writer"]

_CACHE_MAX = 4096


class Authenticator:
    def __init__(self, ledger: Ledger, cache_s: float) -> None:
        self._ledger = ledger
        self._cache_s = cache_s
        self._cache: dict[str, tuple[float, Principal | None]] = {}
        self._lock = threading.Lock()

    def principal(self, token: str) -> Principal | None:
        key = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        found = self._ledger.read(lambda conn: accounts.authenticate(conn, token))
        if self._cache_s > 0:
            with self._lock:
                if len(self._cache) >= _CACHE_MAX:
                    self._cache.clear()
                self._cache[key] = (now + self._cache_s, found)
        return found


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status_code=401, detail=detail, headers={"WWW-Authenticate": "Bearer"})


def current_principal(request: Request) -> Principal:
    """The caller, or 401. Use as ``Depends(current_principal)``."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthorized("missing token: send 'Authorization: Bearer <token>' (gpuledger admin token issue)")
    principal = request.app.state.auth.principal(token.strip())
    if principal is None:
        raise _unauthorized("invalid, expired or revoked token")
    return principal


def require_writer(principal: Principal) -> None:
    if principal.role not in ("admin", "agent"):
        raise HTTPException(status_code=403, detail=f"role {principal.role!r} cannot write runs; use an agent token")
