"""The team server seen from an agent: one small HTTP client, errors translated at the boundary.

- ``Unreachable``: connection refused / reset, timeout, 5xx, 429, 408: try again later (after
  ``retry_after_s`` when the server said how long, as a 429's Retry-After does).
- ``Unauthorized``: 401: the token is missing, wrong or revoked; try again after fixing it.
- ``Forbidden``: 403: the token may not write this run (its project); kept, tried again later.
- ``Rejected``: any other 4xx: the server will never accept this request as it is.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import httpx

from gpuledger import __version__

ENV_SERVER = "GPULEDGER_SERVER"
ENV_TOKEN = "GPULEDGER_TOKEN"
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0
BATCH_LIMIT_B = 4 * 1024 * 1024  # largest ingest batch sent: half the server's default body limit (8 MiB)


class ServerError(Exception):
    """Base of the errors talking to the team server."""


class Unreachable(ServerError):
    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unauthorized(ServerError):
    pass


class Forbidden(ServerError):
    pass


class Rejected(ServerError):
    def __init__(self, status: int, detail: Any) -> None:
        self.status = status
        self.detail = detail
        super().__init__(f"the server refused it ({status}): {_short(detail)}")


def _short(detail: Any) -> str:
    text = detail if isinstance(detail, str) else json.dumps(detail)
    return text if len(text) < 400 else text[:400] + "..."


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds from a Retry-After header in its seconds form; None when absent or a date."""
    try:
        value = float(response.headers.get("retry-after", ""))
    except ValueError:
        return None
    return value if 0 <= value <= 86400 else None


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def normalise_server(url: str) -> str:
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url


def token_from(env: Mapping[str, str] | None = None, token_file: str | None = None) -> str | None:
    """GPULEDGER_TOKEN, else the first line of ``token_file``; None when neither is given."""
    env = os.environ if env is None else env
    if token_file:
        with open(token_file, encoding="utf-8") as fh:
            return fh.readline().strip() or None
    token = env.get(ENV_TOKEN, "").strip()
    return token or None


def token_hint(token: str | None, env: Mapping[str, str] | None = None) -> str:
    """Where to look after a 401: the place the token came from (``token_from`` reads --token-file
    before the environment), so a bad file is not blamed on an unset variable."""
    env = os.environ if env is None else env
    if not token:
        return f"no token was given: use --token-file FILE or set {ENV_TOKEN}"
    if env.get(ENV_TOKEN, "").strip() == token:
        return f"check {ENV_TOKEN}"
    return "check the token in the --token-file file"


class Client:
    def __init__(
        self,
        server: str,
        token: str | None,
        *,
        timeout_s: float = READ_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.server = normalise_server(server)
        self._token_hint = token_hint(token)
        # Lowered when this server (or a proxy before it) answers 413 to a smaller batch (agent/outbox.py).
        self.batch_limit_b = BATCH_LIMIT_B
        headers = {"User-Agent": f"gpuledger/{__version__}"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.server,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s)),
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            raise Unreachable(f"{self.server}: timed out ({exc.__class__.__name__})") from exc
        except httpx.TransportError as exc:
            raise Unreachable(f"{self.server}: {exc.__class__.__name__}: {exc}") from exc
        status = response.status_code
        if status < 400:
            return response
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        if status >= 500 or status in (408, 429):
            raise Unreachable(f"{self.server}: HTTP {status}: {_short(detail)}", _retry_after(response))
        if status == 401:
            raise Unauthorized(f"{self.server}: HTTP 401: {_short(detail)} ({self._token_hint})")
        if status == 403:
            raise Forbidden(f"{self.server}: HTTP 403: {_short(detail)}")
        raise Rejected(status, detail)

    def ingest(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        try:
            body = json.dumps(batch, separators=(",", ":"), allow_nan=False).encode()
        except ValueError:  # a NaN or infinity in a row: sent as text, the server quarantines that row
            body = json.dumps(_finite(batch), separators=(",", ":"), allow_nan=False).encode()
        headers = {"Content-Type": "application/json"}
        return self._request("POST", "/api/v1/ingest", content=body, headers=headers).json()

    def capacity(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """A node's capacity intervals and GPU sightings (agent/capacity_push.py)."""
        return self._request("POST", "/api/v1/capacity", json=batch).json()

    def put_log(self, run_id: str, data: bytes, *, truncated: bool = False) -> dict[str, Any]:
        headers = {"Content-Type": "application/octet-stream", "X-Gpuledger-Log-Truncated": "1" if truncated else "0"}
        return self._request("PUT", f"/api/v1/runs/{run_id}/log", content=data, headers=headers).json()

    def list_runs(self, **filters: Any) -> list[dict[str, Any]]:
        params = {k: v for k, v in filters.items() if v is not None}
        return self._request("GET", "/api/v1/runs", params=params).json()

    def me(self) -> dict[str, Any]:
        return self._request("GET", "/api/v1/me").json()
