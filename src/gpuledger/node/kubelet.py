"""Kubernetes: which pod holds which GPU on this node (a ``ClaimSource``, name "kubernetes").

Two questions, two sources:

* **who may use a GPU** — the kubelet's pod-resources gRPC API on its unix socket
  (``kubelet_grpc.py``): ``List`` gives every pod's containers and the device ids the device
  plugin gave them; ``GetAllocatableResources`` what the node can hand out, so a GPU advertised
  as n time-sliced replicas is known to be shared. Device ids are normalised to NVML UUIDs
  (``kubelet_devices.py``) and each GPU a pod holds becomes ``Allocation(gpu, "pod", pod_uid)``;
  several pods may hold one GPU (time-slicing, MPS), and ``sharing()`` says which.
* **who a pod is** — pod-resources names a pod by namespace and name, a process's cgroup path by
  its UID. The API server ties them together, with the pod's labels and QoS class
  (``kubelet_api.py``, the pods of this node only); without it, the runtime's sandbox labels or
  the kubelet's pod log directories give names and UIDs (``kubelet_runtime.py``).

``claims(now)`` asks the kubelet at most every ``refresh_s`` and the API server every
``identity_refresh_s`` (sooner when the kubelet lists a pod nobody has named yet). It never
raises: when the kubelet goes away (it deletes and recreates its socket on every restart) the
last allocations stay in the claims, ``status()`` says they are stale, and the socket is dialled
again with a backoff doubling up to ``max_backoff_s``; an API server that refuses (RBAC) or
cannot be reached leaves the last pod identities in place and says so.

Pod labels pass through ``core/redaction/redact.py`` before anyone sees them, as containers' labels do.
grpcio and protobuf are the optional ``gpuledger[kubernetes]`` extra: without them the source
still names pods from the API server and ``status()`` says what to install.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from gpuledger.core.redaction.redact import Redactor
from gpuledger.node.claims import Allocation, Claims, PodClaim, SourceOptions
from gpuledger.node.kubelet_api import ApiError, ApiServerClient, PodIdentity, api_config
from gpuledger.node.kubelet_devices import (
    GpuNames,
    PodDevices,
    PodGpus,
    allocatable_gpus,
    dra_gpu_devices,
    pod_gpus,
    shared_gpus,
)
from gpuledger.node.kubelet_runtime import POD_LOG_ROOT, DockerPodLister, identities_from_log_dirs

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
EXTRA_HINT = "install gpuledger[kubernetes] (grpcio and protobuf)"
UNKNOWN_RETRY_S = 5.0  # a pod the kubelet lists and nobody has named: ask the API server again this soon
_MAX_NAMED = 5  # pods named in one status line


def open_source(options: SourceOptions, env: Mapping[str, str] | None = None) -> KubeletSource:
    """The agent's way in (node/claims.py): the kubelet at ``options.kubelet_socket``, the API
    server found as in-cluster clients find it (or ``GPULEDGER_KUBE_API``), ``NODE_NAME`` for
    this node, and the Docker socket's container labels when the API server cannot name a pod."""
    env = dict(os.environ if env is None else env)
    config, api_why = api_config(env)
    api: ApiServerClient | None = None
    if config is not None:
        try:
            api = ApiServerClient(config)
        except (OSError, ValueError) as exc:  # an unreadable or malformed CA bundle
            api_why = f"the CA bundle {config.ca_path} is unusable ({exc})"
    return KubeletSource(
        options.kubelet_socket.strip() or DEFAULT_SOCKET,
        gpus=options.gpus,
        node_name=(env.get("NODE_NAME") or "").strip() or None,
        api=api,
        api_unavailable=api_why,
        runtime_pods=_docker_pods(options.docker_socket),
        pod_log_root=POD_LOG_ROOT,
    )


class KubeletSource:
    """Pods, their GPUs and their labels from one node's kubelet (and the API server)."""

    name = "kubernetes"

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        *,
        gpus: Iterable[tuple[int, str]] = (),
        node_name: str | None = None,
        api: ApiServerClient | None = None,
        api_unavailable: str | None = None,
        runtime_pods: Callable[[], list[PodIdentity]] | None = None,
        pod_log_root: str | None = None,
        redactor: Redactor | None = None,
        refresh_s: float = 2.0,
        identity_refresh_s: float = 30.0,
        max_backoff_s: float = 30.0,
        call_timeout_s: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.socket_path = socket_path
        self._names = GpuNames(gpus)
        self._node = node_name
        self._api = api
        self._api_unavailable = api_unavailable
        self._runtime_pods = runtime_pods
        self._pod_log_root = pod_log_root
        self._redactor = redactor or Redactor.default()
        self._refresh_s = refresh_s
        self._identity_refresh_s = identity_refresh_s
        self._max_backoff_s = max_backoff_s
        self._monotonic = monotonic
        self._wall = wall
        self._lock = threading.Lock()
        self._client: Any = None
        self._missing_extra: str | None = None
        try:
            from gpuledger.node.kubelet_grpc import PodResourcesClient
        except Exception as exc:  # not installed, or older than the generated code needs
            self._missing_extra = f"cannot read pod-resources: {EXTRA_HINT} ({type(exc).__name__}: {exc})"
        else:
            self._client = PodResourcesClient(socket_path, timeout_s=call_timeout_s)
        # The kubelet: what it last listed, and whether it answers now.
        self._listed: list[PodDevices] = []
        self._allocatable: dict[str, int] | None = None
        self._allocatable_served = True
        self._kubelet_ok = False
        self._kubelet_answered_at: float | None = None
        self._kubelet_down_since: float | None = None
        self._kubelet_why: str | None = None
        self._kubelet_next = 0.0
        self._backoff = 0.0
        self.reconnects = 0  # times the kubelet answered again after failing
        # Pod identities: the API server's last good list, and what the node itself says.
        self._api_pods: dict[str, PodIdentity] = {}
        self._api_why: str | None = None
        self._api_listed_at: float | None = None
        self._node_pods: dict[str, PodIdentity] = {}
        self._identity_next = 0.0
        self._identity_tried: float | None = None
        # Derived by the last claims(), for status() and sharing().
        self._unknown: list[str] = []
        self._unresolved: dict[str, tuple[str, ...]] = {}
        self._dra: dict[str, tuple[str, ...]] = {}
        self._holders: dict[str, tuple[str, ...]] = {}
        self._replicas: dict[str, dict[str, tuple[int, ...]]] = {}

    # -- the ClaimSource contract -------------------------------------------------------------------
    def claims(self, now: float) -> Claims:
        mono = self._monotonic()
        if self._client is not None and mono >= self._kubelet_next:
            self._refresh_kubelet(mono)
        if self._identities_due(mono):
            self._refresh_identities(mono)
        return self._build()

    def status(self) -> str | None:
        with self._lock:
            parts = self._kubelet_status()
            if self._kubelet_answered_at is not None or self._client is None:
                parts += self._identity_status()
            parts += self._device_status()
        return "; ".join(parts) if parts else None

    def close(self) -> None:
        for part in (self._client, self._api, self._runtime_pods):
            close = getattr(part, "close", None)
            if close is not None:
                close()

    # -- for the agent, metrics and tests -----------------------------------------------------------
    def sharing(self) -> dict[str, tuple[str, ...]]:
        """GPU UUID → the pods ("namespace/name") holding it, for GPUs more than one pod holds."""
        with self._lock:
            return shared_gpus(self._holders)

    def replicas(self) -> dict[str, dict[str, tuple[int, ...]]]:
        """Pod ("namespace/name") → GPU UUID → the time-sliced replicas of it the pod holds."""
        with self._lock:
            return {pod: dict(r) for pod, r in self._replicas.items()}

    def allocatable(self) -> dict[str, int] | None:
        """GPU UUID → pods the kubelet may place on it (1 whole, n time-sliced); None: not known."""
        with self._lock:
            return dict(self._allocatable) if self._allocatable is not None else None

    # -- the kubelet --------------------------------------------------------------------------------
    def _refresh_kubelet(self, mono: float) -> None:
        from gpuledger.node.kubelet_grpc import KubeletUnavailable

        try:
            listed = self._client.list_pods()
            allocatable = self._client.allocatable() if self._allocatable_served else None
        except KubeletUnavailable as exc:
            self._kubelet_failed(mono, str(exc))
            return
        except Exception as exc:  # a bug here must not stop the agent's view of the node
            self._kubelet_failed(mono, f"unexpected {type(exc).__name__}: {exc}")
            return
        with self._lock:
            if self._kubelet_down_since is not None and self._kubelet_answered_at is not None:
                self.reconnects += 1
            self._listed = listed
            if allocatable is None:
                self._allocatable_served = False
            else:
                self._allocatable = allocatable_gpus(allocatable, self._names)
            self._kubelet_ok, self._kubelet_down_since, self._kubelet_why = True, None, None
            self._kubelet_answered_at = self._wall()
        self._backoff = 0.0
        self._kubelet_next = mono + self._refresh_s

    def _kubelet_failed(self, mono: float, why: str) -> None:
        with self._lock:
            self._kubelet_ok, self._kubelet_why = False, why
            self._allocatable_served = True  # the kubelet that comes back may be a newer one
            if self._kubelet_down_since is None:
                self._kubelet_down_since = self._wall()
        self._backoff = min(max(self._backoff * 2, 1.0), self._max_backoff_s)
        self._kubelet_next = mono + self._backoff

    def _kubelet_status(self) -> list[str]:
        if self._missing_extra is not None:
            return [self._missing_extra]
        if self._kubelet_ok:
            if not self._allocatable_served:
                return ["the kubelet does not serve GetAllocatableResources (before Kubernetes 1.23): "
                        "how many pods may share a GPU is not known"]  # fmt: skip
            return []
        if self._kubelet_answered_at is None:
            return [f"cannot see which pod holds which GPU: {self._kubelet_why or 'not asked yet'}"]
        age = self._wall() - (self._kubelet_down_since or self._wall())
        held = sum(1 for pods in self._holders.values() if pods)
        return [f"pod-resources unreachable for {age:.0f} s ({self._kubelet_why}); reconnecting, "
                f"GPU allocations as last seen ({held} pod{'s' if held != 1 else ''}, stale)"]  # fmt: skip

    # -- pod identities -----------------------------------------------------------------------------
    def _identities_due(self, mono: float) -> bool:
        if mono >= self._identity_next:
            return True
        with self._lock:
            known = {p.key for p in (*self._api_pods.values(), *self._node_pods.values())}
            unknown = any(p.key not in known for p in self._listed)
        return unknown and (self._identity_tried is None or mono - self._identity_tried >= UNKNOWN_RETRY_S)

    def _refresh_identities(self, mono: float) -> None:
        self._identity_tried = mono
        self._identity_next = mono + self._identity_refresh_s
        api_ok = False
        if self._api is not None and self._node:
            try:
                pods = self._api.pods_on_node(self._node)
            except ApiError as exc:
                with self._lock:
                    self._api_why = str(exc)
            else:
                api_ok = True
                with self._lock:
                    self._api_pods = {p.uid: self._redacted(p) for p in pods}
                    self._api_why, self._api_listed_at = None, self._wall()
        node_pods: dict[str, PodIdentity] = {}
        if not api_ok:  # the node's own records name pods the API server did not
            if self._pod_log_root:
                node_pods.update((p.uid, p) for p in identities_from_log_dirs(self._pod_log_root))
            if self._runtime_pods is not None:
                node_pods.update((p.uid, self._redacted(p)) for p in _quietly(self._runtime_pods))
        with self._lock:
            self._node_pods = node_pods

    def _redacted(self, pod: PodIdentity) -> PodIdentity:
        """Labels as every platform's are stored: a secret-looking key's value never leaves the node."""
        return replace(pod, labels=self._redactor.redact_mapping(pod.labels)) if pod.labels else pod

    def _identity_status(self) -> list[str]:
        fallback = sorted({p.source for p in self._node_pods.values()})
        names = {"docker": "the runtime's sandbox labels", "pod-logs": "the kubelet's pod log directories"}
        whence = " and ".join(names.get(s, s) for s in fallback) or "nowhere"
        if self._api is None:
            return [f"pod labels unavailable: {self._api_unavailable or 'no API server'}; pod names from {whence}"]
        if not self._node:
            return [f"pod labels unavailable: NODE_NAME is not set (set it from spec.nodeName through the "
                    f"downward API); pod names from {whence}"]  # fmt: skip
        if self._api_why is not None:
            if self._api_listed_at is not None:
                age = self._wall() - self._api_listed_at
                return [f"{self._api_why}; pod labels as listed {age:.0f} s ago"]
            return [f"{self._api_why}; pod names from {whence}"]
        return []

    # -- the claims ---------------------------------------------------------------------------------
    def _build(self) -> Claims:
        with self._lock:
            identities = {**self._node_pods, **self._api_pods}  # the API server's word wins
            listed = list(self._listed)
        by_key: dict[str, PodIdentity] = {}
        for identity in identities.values():
            by_key[identity.key] = identity  # the newest of two pods of one name (a recreated one) last
        pods = {uid: PodClaim(uid, i.namespace, i.name, dict(i.labels), qos=i.qos) for uid, i in identities.items()}
        allocations: list[Allocation] = []
        holders: dict[str, tuple[str, ...]] = {}
        replicas: dict[str, dict[str, tuple[int, ...]]] = {}
        unknown: list[str] = []
        unresolved: dict[str, tuple[str, ...]] = {}
        dra: dict[str, tuple[str, ...]] = {}
        for listed_pod in listed:
            gpus: PodGpus = pod_gpus(listed_pod, self._names)
            key = listed_pod.key
            if gpus.unresolved:
                unresolved[key] = gpus.unresolved
            claimed = dra_gpu_devices(listed_pod)
            if claimed:
                dra[key] = tuple(sorted({d.driver for d in claimed}))
            if not gpus.devices:
                continue
            holders[key] = gpus.gpus()
            if gpus.replicas:
                replicas[key] = dict(gpus.replicas)
            identity = by_key.get(key)
            if identity is None:
                unknown.append(key)
                continue
            claim = pods[identity.uid]
            pods[identity.uid] = PodClaim(claim.uid, claim.namespace, claim.name, claim.labels,
                                          devices=dict(gpus.devices), qos=claim.qos)  # fmt: skip
            allocations += [Allocation(gpu, "pod", identity.uid) for gpu in gpus.gpus()]
        with self._lock:
            self._holders, self._replicas, self._unknown = holders, replicas, unknown
            self._unresolved, self._dra = unresolved, dra
        return Claims(pods=pods, allocations=allocations)

    def _device_status(self) -> list[str]:
        parts = []
        if self._unknown:
            parts.append(f"GPUs of {_named(self._unknown)} not attributed: no pod UID for them yet "
                         "(the API server has not listed them and the node keeps no record)")  # fmt: skip
        for key, ids in sorted(self._unresolved.items()):
            parts.append(f"device ids {', '.join(ids)} of pod {key} name no GPU of this node")
        for key, drivers in sorted(self._dra.items()):
            parts.append(f"pod {key} holds GPUs through dynamic resource allocation ({', '.join(drivers)}): "
                         "those are not tied to NVML UUIDs and not counted as allocations")  # fmt: skip
        return parts


def _named(keys: list[str]) -> str:
    shown = ", ".join(sorted(keys)[:_MAX_NAMED])
    more = len(keys) - _MAX_NAMED
    return f"pod{'s' if len(keys) != 1 else ''} {shown}" + (f" and {more} more" if more > 0 else "")


def _quietly(source: Callable[[], list[PodIdentity]]) -> list[PodIdentity]:
    try:
        return list(source())
    except Exception:  # a runtime that is not there (or not Docker) names no pods; nothing to report
        return []


def _docker_pods(docker_socket: str) -> DockerPodLister | None:
    """Pods named by the Docker runtime's container labels, when a Docker socket is configured."""
    from gpuledger.node.docker_api import DockerConfigError

    where = docker_socket.strip()
    if where.lower() in ("", "none", "off"):
        return None
    try:
        return DockerPodLister(where if "://" in where else f"unix://{where}")
    except DockerConfigError:
        return None
