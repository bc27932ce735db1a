"""Pod identity from the Kubernetes API server: namespace, name, UID, labels and QoS class of the
pods scheduled to this node (``GET /api/v1/pods?fieldSelector=spec.nodeName=<node>``).

In a cluster (the DaemonSet) the agent finds the API server as every in-cluster client does:
``KUBERNETES_SERVICE_HOST``/``_PORT``, the service account's token and CA bundle under
``/var/run/secrets/kubernetes.io/serviceaccount``; the node's name comes from ``NODE_NAME``,
which the DaemonSet sets from ``spec.nodeName`` through the downward API. Outside a cluster,
``GPULEDGER_KUBE_API`` names an API server URL (``kubectl proxy``'s ``http://127.0.0.1:8001``,
which adds the credentials itself). The token is read again for every request: the kubelet
rotates projected service-account tokens in place.

Only ``GET`` on pods is sent; the ClusterRole in deploy/kubernetes grants get/list/watch on pods
and nothing else. Errors become ``ApiError`` with one line saying why (a 403 names the RBAC fix).
"""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
API_ENV = "GPULEDGER_KUBE_API"
NODE_ENV = "NODE_NAME"
REQUEST_TIMEOUT_S = 10.0
PAGE_SIZE = 500


@dataclass(frozen=True)
class PodIdentity:
    """Who a pod is: what attribution needs beyond the UID a process's cgroup path gives."""

    uid: str
    namespace: str
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    qos: str | None = None  # Guaranteed, Burstable, BestEffort (status.qosClass)
    source: str = "api"  # "api", "docker" (the runtime's sandbox labels), "pod-logs" (/var/log/pods)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ApiConfig:
    base_url: str
    token_path: str | None = None  # a bearer token file, read for every request
    ca_path: str | None = None  # the CA bundle that signs the API server's certificate
    source: str = "in-cluster"  # how it was found, for status lines


class ApiError(Exception):
    """The API server could not be asked, or refused; the message is one line saying why."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def api_config(env: Mapping[str, str], sa_dir: str = SERVICE_ACCOUNT_DIR) -> tuple[ApiConfig | None, str | None]:
    """(config, None), or (None, why there is no API server to ask)."""
    explicit = (env.get(API_ENV) or "").strip().rstrip("/")
    token = os.path.join(sa_dir, "token")
    ca = os.path.join(sa_dir, "ca.crt")
    if explicit:
        if not explicit.startswith(("http://", "https://")):
            return None, f"{API_ENV}={explicit} is not an http:// or https:// URL"
        ca_path = ca if explicit.startswith("https://") and os.path.isfile(ca) else None
        return ApiConfig(explicit, token if os.path.isfile(token) else None, ca_path, API_ENV), None
    host, port = (env.get("KUBERNETES_SERVICE_HOST") or "").strip(), (env.get("KUBERNETES_SERVICE_PORT") or "").strip()
    if not host:
        return None, f"not running in a cluster (no KUBERNETES_SERVICE_HOST) and {API_ENV} is not set"
    if not os.path.isfile(token):
        return None, f"no service-account token at {token} (automountServiceAccountToken is off?)"
    host = f"[{host}]" if ":" in host else host  # an IPv6 service address
    return ApiConfig(f"https://{host}:{port or '443'}", token, ca if os.path.isfile(ca) else None), None


class ApiServerClient:
    """Lists the pods of one node. Thread-safe (httpx's client is)."""

    def __init__(self, config: ApiConfig, *, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.config = config
        verify: ssl.SSLContext | bool = True
        if config.ca_path:
            verify = ssl.create_default_context(cafile=config.ca_path)
        self._http = httpx.Client(base_url=config.base_url, timeout=httpx.Timeout(timeout_s), verify=verify,
                                  trust_env=False)  # fmt: skip  # a cluster-internal address: no proxy

    def pods_on_node(self, node: str) -> list[PodIdentity]:
        """Every pod scheduled to ``node``, page by page; raises ApiError."""
        return [p for doc in self._pages(node) if (p := pod_identity(doc)) is not None]

    def close(self) -> None:
        self._http.close()

    def _pages(self, node: str) -> Iterator[Mapping[str, Any]]:
        params: dict[str, str] = {"fieldSelector": f"spec.nodeName={node}", "limit": str(PAGE_SIZE)}
        while True:
            doc = self._get("/api/v1/pods", params)
            items = doc.get("items")
            if not isinstance(items, list):
                raise ApiError(f"{self.config.base_url}/api/v1/pods answered without a pod list")
            yield from (i for i in items if isinstance(i, Mapping))
            token = (doc.get("metadata") or {}).get("continue")
            if not token:
                return
            params = {**params, "continue": str(token)}

    def _get(self, path: str, params: Mapping[str, str]) -> Mapping[str, Any]:
        headers = {"Accept": "application/json"}
        bearer = self._token()
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        where = self.config.base_url
        try:
            response = self._http.get(path, params=params, headers=headers)
        except httpx.HTTPError as exc:
            raise ApiError(f"API server {where} unreachable: {_reason(exc)}") from exc
        except RuntimeError as exc:  # the client was closed from another thread
            raise ApiError("the API client is closed") from exc
        if response.status_code >= 400:
            raise ApiError(_refusal(response, where), response.status_code)
        try:
            doc = response.json()
        except ValueError as exc:
            raise ApiError(f"{where}{path} answered {response.status_code} with something that is not JSON") from exc
        if not isinstance(doc, Mapping):
            raise ApiError(f"{where}{path} answered with JSON that is not an object")
        return doc

    def _token(self) -> str | None:
        if not self.config.token_path:
            return None
        try:
            with open(self.config.token_path, encoding="utf-8") as f:
                return f.read().strip() or None
        except OSError as exc:
            raise ApiError(f"cannot read the service-account token {self.config.token_path}: {exc.strerror}") from exc


def pod_identity(doc: Mapping[str, Any]) -> PodIdentity | None:
    """A pod object's identity; None when it has no UID, namespace or name."""
    meta = doc.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    uid, namespace, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
    if not (isinstance(uid, str) and uid and isinstance(namespace, str) and isinstance(name, str)):
        return None
    raw_labels = meta.get("labels")
    labels = {str(k): str(v) for k, v in raw_labels.items()} if isinstance(raw_labels, Mapping) else {}
    status = doc.get("status")
    qos = status.get("qosClass") if isinstance(status, Mapping) else None
    return PodIdentity(uid, namespace, name, labels, qos if isinstance(qos, str) and qos else None)


def _refusal(response: httpx.Response, where: str) -> str:
    """One line for an error status; the API server's Status object says why in ``message``."""
    message = ""
    with contextlib.suppress(ValueError, AttributeError):
        message = str(response.json().get("message") or "")
    message = " ".join((message or response.reason_phrase or "error").split())[:300]
    code = response.status_code
    if code == 403:
        return (
            f"the API server refused to list pods (403 Forbidden: {message}); the agent's service account "
            "needs get/list/watch on pods (deploy/kubernetes/rbac.yaml)"
        )
    if code == 401:
        return f"the API server did not accept the agent's credentials (401 Unauthorized: {message})"
    return f"the API server answered {code} to listing pods: {message}"


def _reason(exc: Exception) -> str:
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"TLS verification failed ({cause.verify_message}); is the CA bundle the cluster's?"
        cause = cause.__cause__ or cause.__context__
    return f"{type(exc).__name__}: {exc}"
