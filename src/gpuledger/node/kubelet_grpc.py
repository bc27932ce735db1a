"""A client of the kubelet's pod-resources gRPC API over its unix socket (``List``, ``GetAllocatableResources``).

The messages come from ``kubelet_podresources.proto`` (a committed generated module; the proto
says how to regenerate it); the calls are made from the proto's own service descriptor.
Importing this module needs grpcio and protobuf, the ``gpuledger[kubernetes]`` extra:
``kubelet.py`` imports it lazily and says so when they are missing.

Every failure becomes ``KubeletUnavailable`` with one line saying why and, where there is one,
the usual fix. A failed call also drops the channel, so the next call dials the socket afresh:
after a kubelet restart the socket is a new inode at the same path, and gRPC's own reconnect
backoff (up to two minutes) would otherwise decide when the agent sees the kubelet again.
"""

from __future__ import annotations

import os
import stat
import threading

# gRPC's C core logs connection chatter (a kubelet restart's GOAWAY ...) to stderr, which is the
# agent's own report; errors only, unless the operator asked for more. Read when grpc is imported.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc

from gpuledger.node import kubelet_podresources_pb2 as pb
from gpuledger.node.kubelet_devices import DeviceGroup, DraDevice, PodDevices

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
CALL_TIMEOUT_S = 5.0
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # the kubelet's own limit for pod-resources answers
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.enable_http_proxy", 0),  # an https_proxy in the environment must not capture a unix socket
]


SERVICE = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]


def lister_calls(channel: grpc.Channel) -> dict[str, grpc.UnaryUnaryMultiCallable]:
    """The pod-resources service's methods on ``channel`` (all unary), by name, built from the
    proto's descriptor: what grpcio's generated stub holds, without the server skeleton it
    generates beside it (the agent is only ever a client)."""
    return {
        m.name: channel.unary_unary(
            f"/{SERVICE.full_name}/{m.name}",
            request_serializer=getattr(pb, m.input_type.name).SerializeToString,
            response_deserializer=getattr(pb, m.output_type.name).FromString,
        )
        for m in SERVICE.methods
    }


class KubeletUnavailable(Exception):
    """The pod-resources API could not be asked; the message is one line saying why."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code  # the gRPC status code's name, when the kubelet answered with one


class PodResourcesClient:
    """``List`` and ``GetAllocatableResources`` on one socket. Thread-safe; calls block at most ``timeout_s``."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.socket_path = socket_path
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: dict[str, grpc.UnaryUnaryMultiCallable] | None = None
        self._closed = False

    def list_pods(self) -> list[PodDevices]:
        """Every pod the kubelet runs, with each container's devices."""
        answer = self._call("List", pb.ListPodResourcesRequest())
        return [_pod(p) for p in answer.pod_resources]

    def allocatable(self) -> list[DeviceGroup] | None:
        """The devices the node can allocate; None when the kubelet does not serve the call (before 1.23)."""
        try:
            answer = self._call("GetAllocatableResources", pb.AllocatableResourcesRequest())
        except KubeletUnavailable as exc:
            if exc.code == "UNIMPLEMENTED":
                return None
            raise
        return [_group(d) for d in answer.devices]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop()

    # -- internals ----------------------------------------------------------------------------------
    def _call(self, method: str, request: object) -> object:
        problem = socket_problem(self.socket_path)
        if problem is not None:
            with self._lock:
                self._drop()
            raise KubeletUnavailable(problem)
        with self._lock:
            if self._closed:
                raise KubeletUnavailable("the pod-resources client is closed")
            if self._stub is None:
                self._channel = grpc.insecure_channel(f"unix://{os.path.abspath(self.socket_path)}", _CHANNEL_OPTIONS)
                self._stub = lister_calls(self._channel)
            stub = self._stub
        try:
            return stub[method](request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            with self._lock:
                self._drop()
            raise KubeletUnavailable(_why(exc, method, self.socket_path), _code(exc)) from exc
        except ValueError as exc:  # grpc: "Cannot invoke RPC on closed channel!" (close() from another thread)
            raise KubeletUnavailable(f"the pod-resources client is closed ({exc})") from exc

    def _drop(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel, self._stub = None, None


def socket_problem(path: str) -> str | None:
    """Why ``path`` cannot be the kubelet's socket before dialling it; None when it may be."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return (
            f"no pod-resources socket at {path} (not a Kubernetes node, the kubelet is restarting, "
            "or its directory /var/lib/kubelet/pod-resources is not mounted)"
        )
    except PermissionError:
        return f"permission denied on {path} (the pod-resources directory is root's: run the agent as root)"
    except OSError as exc:
        return f"cannot stat {path}: {exc.strerror or exc}"
    if not stat.S_ISSOCK(mode):
        return f"{path} is not a unix socket"
    if not os.access(path, os.R_OK | os.W_OK):
        return f"permission denied on {path} (the pod-resources socket is root's: run the agent as root)"
    return None


def _code(exc: grpc.RpcError) -> str | None:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    return code.name if code is not None else None


def _why(exc: grpc.RpcError, method: str, path: str) -> str:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = (exc.details() if isinstance(exc, grpc.Call) else None) or str(exc)
    details = " ".join(details.split())[:300]
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return f"the kubelet at {path} does not serve {method} of the v1 pod-resources API (kubelet older than 1.20?)"
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return f"the kubelet at {path} refused {method}: {details}"
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return f"the kubelet at {path} is rate-limiting pod-resources calls ({details})"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{path} did not answer {method} within its deadline (a hung kubelet, or not a gRPC server)"
    if code == grpc.StatusCode.INTERNAL:
        return f"{path} answered {method} with something that is not a pod-resources answer ({details})"
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"{path} does not answer as the kubelet's pod-resources API ({details})"
    return f"{method} on {path} failed: {code.name if code else type(exc).__name__}: {details}"


def _group(devices: pb.ContainerDevices) -> DeviceGroup:
    numa = tuple(n.ID for n in devices.topology.nodes) if devices.HasField("topology") else ()
    return DeviceGroup(devices.resource_name, tuple(devices.device_ids), numa)


def _pod(pod: pb.PodResources) -> PodDevices:
    containers: dict[str, tuple[DeviceGroup, ...]] = {}
    dra: dict[str, tuple[DraDevice, ...]] = {}
    for c in pod.containers:
        containers[c.name] = tuple(_group(d) for d in c.devices)
        claimed = [
            DraDevice(
                f"{r.claim_namespace}/{r.claim_name}",
                res.driver_name,
                res.device_name,
                tuple(d.name for d in res.cdi_devices),
            )
            for r in c.dynamic_resources
            for res in r.claim_resources
        ]
        if claimed:
            dra[c.name] = tuple(claimed)
    return PodDevices(pod.namespace, pod.name, containers, dra)
