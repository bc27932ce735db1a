"""Who is calling: ``Authorization: Bearer <token>`` -> Principal, for every route.

The request guard (guard.py) authenticates every API request before any of its body is read and
leaves the principal in the request's state; ``current_principal``, the FastAPI dependency every
route takes (the dashboard and /metrics routers too), returns it, or authenticates itself when the
guard did not run. Tokens are looked up in the ledger (accounts.authenticate: constant-time compare
of the secret's sha256) and the principal is cached for ``Settings.token_cache_s`` seconds. A cached
token is still checked on every use (one indexed query: revoked, expired, user disabled), so a
revoked or expired token stops working at once on every replica; the cache saves the secret's
compare and the memberships query, not the check.

The cache is two LRUs: valid tokens, and failed lookups. A flood of made-up tokens only churns the
second, so it can never push the real tokens out and turn every request into a database lookup;
text that is not even shaped like a token is refused without a lookup and not cached at all.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

import sqlalchemy as sa
from fastapi import HTTPException, Request

from gpuledger.core.audit.access import Principal, parse_token
from gpuledger.store import accounts, schema

if TYPE_CHECKING:
    from gpuledger.store import Ledger

__all__ = ["PRINCIPAL_KEY", "Authenticator", "Principal", "bearer_token", "current_principal", "require_writer"]

PRINCIPAL_KEY = "gpuledger.principal"  # where the guard leaves the caller in the ASGI scope's state


class Authenticator:
    def __init__(self, ledger: Ledger, cache_s: float, size: int = 4096) -> None:
        self._ledger = ledger
        self._cache_s = cache_s
        self._size = max(1, size)
        self._valid: OrderedDict[str, tuple[float, Principal]] = OrderedDict()
        self._failed: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()
        self.lookups = 0  # database lookups made (for the tests and the curious)

    @staticmethod
    def _key(token: str) -> str:
        return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()

    def cached(self, token: str) -> tuple[bool, Principal | None]:
        """(known, principal): known only for a refusal (not shaped like a token, or a failed lookup
        still cached); a valid token always needs the database (``principal``)."""
        if parse_token(token) is None:
            return True, None  # not shaped like a token: no lookup
        key, now = self._key(token), time.monotonic()
        with self._lock:
            failed = self._failed.get(key)
            if failed is not None and failed > now:
                return True, None
        return False, None

    def _hit(self, token: str) -> Principal | None:
        key, now = self._key(token), time.monotonic()
        with self._lock:
            hit = self._valid.get(key)
            if hit is not None and hit[0] > now:
                self._valid.move_to_end(key)
                return hit[1]
        return None

    def principal(self, token: str) -> Principal | None:
        known, principal = self.cached(token)
        if known:
            return principal
        hit = self._hit(token)
        if hit is not None:
            if self._ledger.read(lambda conn: still_valid(conn, hit.token_id)):
                return hit
            self._forget(token)
            return None
        found = self._ledger.read(lambda conn: accounts.authenticate(conn, token))
        self.lookups += 1
        if self._cache_s > 0:
            key, until = self._key(token), time.monotonic() + self._cache_s
            with self._lock:
                if found is not None:
                    self._valid.pop(key, None)
                    self._valid[key] = (until, found)
                    _trim(self._valid, self._size)
                else:
                    self._failed.pop(key, None)
                    self._failed[key] = until
                    _trim(self._failed, self._size)
        return found

    def _forget(self, token: str) -> None:
        """A cached token found revoked or expired: a failed lookup from now on."""
        key = self._key(token)
        with self._lock:
            self._valid.pop(key, None)
            if self._cache_s > 0:
                self._failed[key] = time.monotonic() + self._cache_s
                _trim(self._failed, self._size)


def still_valid(conn: sa.Connection, token_id: str, now: float | None = None) -> bool:
    """The token is neither revoked nor expired, and its user is not disabled (checked on every use
    of a cached token: the cache must never outlive ``expires_at`` or a revocation)."""
    t, u = schema.api_tokens.c, schema.users.c
    q = sa.select(t.expires_at, t.revoked_at, u.disabled).join(schema.users, u.name == t.user_name)
    row = conn.execute(q.where(t.id == token_id)).first()
    now = time.time() if now is None else now
    return (
        row is not None
        and row.revoked_at is None
        and not row.disabled
        and (row.expires_at is None or row.expires_at > now)
    )


def _trim(lru: OrderedDict[str, object], size: int) -> None:
    while len(lru) > size:
        lru.popitem(last=False)  # the least recently used


def bearer_token(header: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, else None."""
    scheme, _, token = header.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def unauthorized(detail: str) -> HTTPException:
    return HTTPException(status_code=401, detail=detail, headers={"WWW-Authenticate": "Bearer"})


MISSING_TOKEN = "missing token: send 'Authorization: Bearer <token>' (gpuledger admin token issue)"
BAD_TOKEN = "invalid, expired or revoked token"


def current_principal(request: Request) -> Principal:
    """The caller, or 401. Use as ``Depends(current_principal)``."""
    known = request.scope.get("state", {}).get(PRINCIPAL_KEY)
    if known is not None:
        return known
    token = bearer_token(request.headers.get("authorization", ""))
    if token is None:
        raise unauthorized(MISSING_TOKEN)
    principal = request.app.state.auth.principal(token)
    if principal is None:
        raise unauthorized(BAD_TOKEN)
    return principal


def require_writer(principal: Principal) -> None:
    if principal.role not in ("admin", "agent"):
        raise HTTPException(status_code=403, detail=f"role {principal.role!r} cannot write runs; use an agent token")
