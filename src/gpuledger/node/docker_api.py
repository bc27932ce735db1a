"""A read-only Docker Engine API client: the few GET endpoints the node agent needs.

Only ``GET`` is ever sent, so the agent works through a read-only socket proxy (docs/AGENT.md):
``/containers/json``, ``/containers/{id}/json``, ``/containers/{id}/logs`` and ``/events``. The
daemon is reached over its unix socket (``DOCKER_HOST=unix:///path``, default
``/var/run/docker.sock``) or, for a proxy, plain HTTP (``DOCKER_HOST=tcp://host:port``).

Every path is versioned (``/v1.41/containers/json``), as the official clients do it: a daemon refuses
clients older than its minimum (Engine 29 refuses everything below API 1.44), and an unversioned
path is answered at the daemon's newest version, whose shapes this client may not know. The
version is negotiated like moby's ``client.NegotiateAPIVersion``: ``GET /_ping`` (unversioned)
answers with the daemon's newest version in its ``API-Version`` header (a daemon that sends none
is 1.24 or older), ``GET /version`` with its ``MinAPIVersion``; the client speaks the lower of its
own newest (``CLIENT_API_VERSION``) and the daemon's, never below the daemon's minimum. A daemon
older than ``MIN_API_VERSION`` is a clear error. ``negotiate()`` is called again at every
reconnection, so a daemon upgraded under a running agent is asked again.

Streams (events, logs) are read without a read timeout by default, since a quiet container or a
quiet node sends nothing for hours; ``interrupt()`` shuts their sockets from another thread so a
blocked reader returns at once (closing the httpx client alone does not wake it).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

DEFAULT_SOCKET = "/var/run/docker.sock"
REQUEST_TIMEOUT_S = 10.0
# The newest API version this client was read against (Engine 29). The fields it reads (Config,
# State, HostConfig.DeviceRequests/Annotations/Runtime, Mounts, events, logs) did not move since 1.25.
CLIENT_API_VERSION = (1, 52)
# The oldest it speaks: 1.25 (Engine 1.13) is the first whose /_ping says its version; moby's
# client takes a daemon that does not say it for 1.24.
MIN_API_VERSION = (1, 25)
_NO_HEADER_VERSION = (1, 24)
ApiVersion = tuple[int, int]


def parse_api_version(text: object) -> ApiVersion | None:
    """``"1.41"`` -> (1, 41); None for anything else (compared as numbers: 1.9 < 1.10)."""
    if not isinstance(text, str):
        return None
    major, dot, minor = text.strip().partition(".")
    if not dot or not major.isdigit() or not minor.isdigit():
        return None
    return int(major), int(minor)


def version_text(version: ApiVersion) -> str:
    return f"{version[0]}.{version[1]}"


def negotiate_version(daemon: ApiVersion | None, daemon_min: ApiVersion | None) -> ApiVersion:
    """The version to speak with a daemon whose newest is ``daemon`` (None: it did not say) and
    whose oldest is ``daemon_min`` (None: unknown). Raises DockerApiError for a daemon too old."""
    newest = daemon or _NO_HEADER_VERSION
    version = min(CLIENT_API_VERSION, newest)
    if daemon_min is not None and version < daemon_min:
        # A daemon newer than this client: speak its oldest rather than be refused (the fields
        # read here are stable; docker-java does the same).
        version = daemon_min
    if version < MIN_API_VERSION:
        raise DockerApiError(
            f"the Docker daemon speaks API {version_text(newest)}"
            f"{'' if daemon else ' or older (its /_ping sends no API-Version)'}; gpuledger needs "
            f"{version_text(MIN_API_VERSION)} or newer (Docker Engine 1.13+)"
        )
    return version


class DockerConfigError(ValueError):
    """DOCKER_HOST names something this client cannot use; the message says what to set instead."""


class DockerApiError(Exception):
    """The daemon (or a proxy in front of it) answered with an error status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class DockerUnavailable(DockerApiError):
    """The daemon could not be reached, or the connection broke mid-stream."""


class VersionRefused(DockerUnavailable):
    """The daemon refused the API version asked at ("client version 1.41 is too old"); the next
    request renegotiates."""


def docker_host(env: Mapping[str, str]) -> tuple[str, str | None]:
    """(base URL, unix socket path or None) from ``DOCKER_HOST``; raises DockerConfigError."""
    host = (env.get("DOCKER_HOST") or "").strip() or f"unix://{DEFAULT_SOCKET}"
    if host.startswith("unix://"):
        path = host[len("unix://") :]
        if not path.startswith("/"):
            raise DockerConfigError(
                f"DOCKER_HOST={host}: a unix socket needs an absolute path (unix:///run/docker.sock)"
            )
        return "http://docker", path
    if host.startswith(("tcp://", "http://")):
        if env.get("DOCKER_TLS_VERIFY") or env.get("DOCKER_CERT_PATH"):
            raise DockerConfigError(
                "DOCKER_TLS_VERIFY/DOCKER_CERT_PATH are set: TLS to the daemon is not supported; "
                "run the agent on the node against the unix socket or a read-only socket proxy"
            )
        rest = host.split("://", 1)[1].rstrip("/")
        if not rest:
            raise DockerConfigError(f"DOCKER_HOST={host}: no host:port")
        has_port = ":" in rest.rsplit("]", 1)[-1]  # "[::1]:2375" has one, "[::1]" has not
        return f"http://{rest if has_port else rest + ':2375'}", None  # 2375: Docker's plain-HTTP port
    raise DockerConfigError(
        f"DOCKER_HOST={host}: only unix:///path and tcp://host:port (plain HTTP, e.g. a socket proxy) are supported"
    )


def _why(exc: Exception, where: str) -> str:
    """One line saying why the daemon could not be reached, with the usual fix."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, PermissionError) or getattr(cause, "errno", None) == errno.EACCES:
            return (
                f"permission denied on {where} (the agent's user needs access to the Docker socket, "
                "or point DOCKER_HOST at a read-only socket proxy)"
            )
        if isinstance(cause, FileNotFoundError) or getattr(cause, "errno", None) == errno.ENOENT:
            return f"no Docker socket at {where}"
        if isinstance(cause, ConnectionRefusedError) or getattr(cause, "errno", None) == errno.ECONNREFUSED:
            return f"connection refused at {where} (is dockerd running?)"
        cause = cause.__cause__ or cause.__context__
    return f"{where}: {type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class LogStream:
    """A log's chunks, with what says how they are framed: the response's ``Content-Type`` and
    the API version it was asked at (docker_logs.decoder_for)."""

    chunks: Iterator[bytes]
    content_type: str | None
    api_version: ApiVersion | None


class DockerClient:
    """GET requests to one daemon. Thread-safe: each stream uses its own connection."""

    def __init__(self, env: Mapping[str, str] | None = None, *, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        base_url, self.socket_path = docker_host(os.environ if env is None else env)
        self.where = self.socket_path or base_url
        transport = httpx.HTTPTransport(uds=self.socket_path) if self.socket_path else httpx.HTTPTransport()
        # read=None for streams is set per request; plain requests keep the full timeout.
        self._http = httpx.Client(transport=transport, base_url=base_url, timeout=httpx.Timeout(timeout_s))
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        self.api_version: ApiVersion | None = None  # negotiated by negotiate(), on first use

    # -- version negotiation ----------------------------------------------------------------------
    def negotiate(self) -> ApiVersion:
        """Ask the daemon which API versions it speaks and settle on one (see the module doc)."""
        daemon: ApiVersion | None = None
        daemon_min: ApiVersion | None = None
        refused: DockerApiError | None = None
        try:
            ping = self._request("/_ping")
            daemon = parse_api_version(ping.headers.get("API-Version"))
        except DockerApiError as exc:
            if isinstance(exc, DockerUnavailable):
                raise
            refused = exc  # a proxy that does not allow /_ping: /version says it too
        try:
            doc = self._request("/version").json()
        except (DockerApiError, ValueError) as exc:
            if isinstance(exc, DockerUnavailable):
                raise
            if refused is not None:
                raise DockerApiError(
                    f"cannot learn the daemon's API version: {refused}; allow GET /_ping or /version "
                    "on the socket proxy (docker-socket-proxy allows both by default)"
                ) from exc
            doc = {}
        if isinstance(doc, dict):
            daemon = daemon or parse_api_version(doc.get("ApiVersion"))
            daemon_min = parse_api_version(doc.get("MinAPIVersion"))
        version = negotiate_version(daemon, daemon_min)
        with self._lock:
            self.api_version = version
        return version

    def _path(self, path: str) -> str:
        version = self.api_version or self.negotiate()
        return f"/v{version_text(version)}{path}"

    # -- plain requests ---------------------------------------------------------------------------
    def _get(self, path: str, params: Mapping[str, Any] | None = None) -> httpx.Response:
        try:
            return self._request(self._path(path), params)
        except VersionRefused:
            return self._request(self._path(path), params)  # asked again at a renegotiated version

    def _request(self, path: str, params: Mapping[str, Any] | None = None) -> httpx.Response:
        """GET ``path`` as given (unversioned for /_ping and /version)."""
        if self._closed:
            raise DockerUnavailable("the client is closed")
        try:
            response = self._http.get(path, params=params)
        except httpx.HTTPError as exc:
            raise DockerUnavailable(_why(exc, self.where)) from exc
        except RuntimeError as exc:  # httpx: "the client has been closed", by close() in another thread
            raise DockerUnavailable("the client is closed") from exc
        if response.status_code >= 400:
            raise self._refusal(path, response)
        return response

    def _refusal(self, path: str, response: httpx.Response) -> DockerApiError:
        """The error for an answer >= 400. A daemon that refuses the version asked at was upgraded
        or downgraded under us: forget the version (the next request renegotiates) and say so as
        VersionRefused, which callers retry like a daemon restarting."""
        text = _error_text(path, response)
        if response.status_code == 400 and "client version" in text and self.api_version is not None:
            with self._lock:
                self.api_version = None
            return VersionRefused(text, 400)
        return DockerApiError(text, response.status_code)

    def _json(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        response = self._get(path, params)
        try:
            return response.json()
        except ValueError as exc:
            raise DockerApiError(f"GET {path}: the answer is not JSON (is {self.where} a Docker daemon?)") from exc

    def containers(self, *, all: bool = False) -> list[dict[str, Any]]:
        """The container list (``/containers/json``): running ones, or every one with ``all``."""
        return self._json("/containers/json", {"all": "1" if all else "0"})

    def inspect(self, container_id: str) -> dict[str, Any] | None:
        """``/containers/{id}/json``; None when the container no longer exists."""
        try:
            return self._json(f"/containers/{container_id}/json")
        except DockerApiError as exc:
            if exc.status == 404:
                return None
            raise

    # -- streams ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _stream(self, path: str, params: Mapping[str, Any], read_timeout_s: float | None) -> Iterator[httpx.Response]:
        timeout = httpx.Timeout(REQUEST_TIMEOUT_S, read=read_timeout_s)
        if self._closed:
            raise DockerUnavailable("the client is closed")
        path = self._path(path)
        try:
            with self._http.stream("GET", path, params=params, timeout=timeout) as response:
                if response.status_code >= 400:
                    response.read()
                    raise self._refusal(path, response)
                sock = _socket_of(response)
                self._track(sock, add=True)
                try:
                    yield response
                finally:
                    self._track(sock, add=False)
        except httpx.HTTPError as exc:
            if self._closed:
                raise DockerUnavailable("the client is closed") from exc
            raise DockerUnavailable(_why(exc, self.where)) from exc
        except RuntimeError as exc:
            raise DockerUnavailable("the client is closed") from exc

    def _track(self, sock: socket.socket | None, *, add: bool) -> None:
        if sock is None:
            return
        with self._lock:
            if add:
                self._open.add(sock)
            else:
                self._open.discard(sock)
            closed = self._closed
        if add and closed:
            _shutdown(sock)

    @contextlib.contextmanager
    def events(
        self, filters: Mapping[str, list[str]], since: str | None = None, read_timeout_s: float | None = None
    ) -> Iterator[Iterator[dict[str, Any]]]:
        """``/events`` as an iterator of event objects (one JSON object per line)."""
        params: dict[str, str] = {"filters": json.dumps(dict(filters))}
        if since:
            params["since"] = since
        with self._stream("/events", params, read_timeout_s) as response:
            yield _json_lines(response)

    @contextlib.contextmanager
    def logs(
        self, container_id: str, *, since: str | None = None, follow: bool = True, read_timeout_s: float | None = None
    ) -> Iterator[LogStream]:
        """``/containers/{id}/logs`` with timestamps, both streams, as raw chunks (see docker_logs.py)."""
        params = {"stdout": "1", "stderr": "1", "timestamps": "1", "follow": "1" if follow else "0"}
        if since:
            params["since"] = since
        with self._stream(f"/containers/{container_id}/logs", params, read_timeout_s) as response:
            yield LogStream(response.iter_raw(), response.headers.get("Content-Type"), self.api_version)

    def interrupt(self) -> None:
        """Wake every reader blocked on a stream (they see DockerUnavailable)."""
        with self._lock:
            socks = list(self._open)
        for sock in socks:
            _shutdown(sock)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.interrupt()
        self._http.close()


def _json_lines(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue  # not an event: a proxy's banner or a cut line; the next one is whole
        if isinstance(doc, dict):
            yield doc


def _error_text(path: str, response: httpx.Response) -> str:
    """The daemon's ``{"message": ...}``, or a proxy's status line (HAProxy answers 403 in HTML)."""
    message = ""
    with contextlib.suppress(ValueError, AttributeError):
        message = str(response.json().get("message") or "")
    if not message:
        message = response.reason_phrase or "error"
    hint = " (refused by a socket proxy? allow this endpoint)" if response.status_code == 403 else ""
    return f"GET {path}: {response.status_code} {message.strip()[:300]}{hint}"


def _socket_of(response: httpx.Response) -> socket.socket | None:
    stream = response.extensions.get("network_stream")
    if stream is None:
        return None
    with contextlib.suppress(Exception):
        sock = stream.get_extra_info("socket")
        return sock if isinstance(sock, socket.socket) else None
    return None


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
