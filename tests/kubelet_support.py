"""Stand-ins for the Kubernetes side of a GPU node, for the kubelet adapter's tests.

``FakeKubelet`` serves the pod-resources API with grpcio on a unix socket, built from the same
proto as the agent (the wire contract; nothing else of the agent is imported here). It behaves as
the Kubernetes documentation describes the kubelet: ``List`` gives every pod it runs by namespace
and name (no UID) with each container's devices as the device plugin named them;
``GetAllocatableResources`` every device it could hand out (a kubelet before 1.23 does not serve it:
``serve_allocatable=False`` answers UNIMPLEMENTED, as gRPC does for a method a server lacks); a
restart deletes the socket and creates a new one at the same path.

``ApiServer`` answers ``GET /api/v1/pods`` on 127.0.0.1 the way the API server does: a PodList
filtered by ``fieldSelector=spec.nodeName=<node>``, paged by ``limit``/``continue``, a ``Status``
object with ``reason: Forbidden`` and code 403 when RBAC refuses, 401 without the expected
bearer token. ``RECORDED_PODS`` is the pod list such a server returns (trimmed to the fields the
agent reads and a few it must ignore).

``GarbageSocket`` is a unix socket that answers anything with bytes that are not HTTP/2, or with
nothing at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import threading
from collections.abc import Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import grpc

from gpuledger.node import kubelet_podresources_pb2 as pb

DATA = Path(__file__).parent / "data" / "kubernetes"
NODE = "gpu-node-1"
# The node's GPUs as NVML lists them: two whole GPUs, a MIG-enabled one and one of its slices.
GPU_A = "GPU-1f8c2a9e-56a1-4d7c-9a0b-3c1e2f4d5a6b"
GPU_B = "GPU-7d3e9b10-2c4f-48a6-b1e2-9f0a8c7d6e5f"
GPU_MIG_PARENT = "GPU-a0b1c2d3-e4f5-4a6b-8c9d-0e1f2a3b4c5d"
MIG_1 = "MIG-5e6f7a8b-9c0d-5e1f-a2b3-c4d5e6f7a8b9"
NODE_GPUS = ((0, GPU_A), (1, GPU_B), (2, GPU_MIG_PARENT), (2, MIG_1))


# -- the kubelet -----------------------------------------------------------------------------------
@dataclass
class Container:
    name: str
    devices: Sequence[tuple[str, Sequence[str]]] = ()  # (resource name, device ids)
    dra: Sequence[tuple[str, str, str]] = ()  # (claim name, driver, device name)


@dataclass
class Pod:
    namespace: str
    name: str
    containers: Sequence[Container] = field(default_factory=list)


def _devices(resource: str, ids: Sequence[str], numa: int | None = 0) -> pb.ContainerDevices:
    topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=numa)]) if numa is not None else None
    return pb.ContainerDevices(resource_name=resource, device_ids=list(ids), topology=topology)


def _pod_message(pod: Pod) -> pb.PodResources:
    containers = []
    for c in pod.containers:
        dra = [
            pb.DynamicResource(
                claim_name=claim, claim_namespace=pod.namespace,
                claim_resources=[pb.ClaimResource(driver_name=driver, pool_name=NODE, device_name=device,
                                                  cdi_devices=[pb.CDIDevice(name=f"k8s.{driver}/claim={device}")])],
            )
            for claim, driver, device in c.dra
        ]  # fmt: skip
        containers.append(
            pb.ContainerResources(
                name=c.name, devices=[_devices(r, ids) for r, ids in c.devices], cpu_ids=[2, 3], dynamic_resources=dra
            )
        )
    return pb.PodResources(name=pod.name, namespace=pod.namespace, containers=containers)


class _Lister:
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    def List(self, request, context):
        self.kubelet.calls.append("List")
        return pb.ListPodResourcesResponse(pod_resources=[_pod_message(p) for p in self.kubelet.pods])

    def GetAllocatableResources(self, request, context):
        self.kubelet.calls.append("GetAllocatableResources")
        if not self.kubelet.serve_allocatable:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        return pb.AllocatableResourcesResponse(
            devices=[_devices(r, ids) for r, ids in self.kubelet.allocatable], cpu_ids=list(range(8))
        )

    def Get(self, request, context):
        self.kubelet.calls.append("Get")
        for p in self.kubelet.pods:
            if (p.namespace, p.name) == (request.pod_namespace, request.pod_name):
                return pb.GetPodResourcesResponse(pod_resources=_pod_message(p))
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_name} not found in {request.pod_namespace}")


def _handlers(lister: _Lister) -> grpc.GenericRpcHandler:
    """The service as the kubelet serves it: /v1.PodResourcesLister/<Method>, from the proto."""
    service = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
    return grpc.method_handlers_generic_handler(service.full_name, {
        m.name: grpc.unary_unary_rpc_method_handler(
            getattr(lister, m.name),
            request_deserializer=getattr(pb, m.input_type.name).FromString,
            response_serializer=getattr(pb, m.output_type.name).SerializeToString,
        )
        for m in service.methods
    })  # fmt: skip


class FakeKubelet:
    """The pod-resources service on ``path``; ``stop()`` then ``start()`` is a kubelet restart."""

    def __init__(self, path: Path, pods: Sequence[Pod] = (), allocatable: Sequence[tuple[str, Sequence[str]]] = (),
                 *, serve_allocatable: bool = True) -> None:  # fmt: skip
        self.path = path
        self.pods = list(pods)
        self.allocatable = list(allocatable)
        self.serve_allocatable = serve_allocatable
        self.calls: list[str] = []
        self._server: grpc.Server | None = None

    def start(self) -> FakeKubelet:
        if self.path.exists():
            self.path.unlink()  # the kubelet removes a stale socket before it listens
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        server.add_generic_rpc_handlers((_handlers(_Lister(self)),))
        server.add_insecure_port(f"unix://{self.path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        if self.path.exists():
            self.path.unlink()  # the socket goes with the kubelet


class GarbageSocket:
    """A unix socket whose peer is no gRPC server: ``reply`` bytes then close, or silence."""

    def __init__(self, path: Path, reply: bytes | None) -> None:
        self.path = path
        self.reply = reply
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        self._sock.listen(8)
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            if self.reply is None:
                self._held.append(conn)  # accept and say nothing
                continue
            try:
                conn.recv(4096)
                conn.sendall(self.reply)
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone does not
        self._sock.close()
        for conn in self._held:
            conn.close()
        self._thread.join(timeout=5)


# -- the API server --------------------------------------------------------------------------------
def recorded_pods() -> dict:
    return json.loads((DATA / "pods_on_node.json").read_text())


class ApiServer:
    """``GET /api/v1/pods`` on 127.0.0.1 (plain HTTP, or HTTPS with ``tls=(cert, key)``)."""

    def __init__(self, pod_list: Mapping | None = None, *, token: str | None = "sa-token-1",
                 page_size: int | None = None, tls: tuple[Path, Path] | None = None) -> None:  # fmt: skip
        self.pod_list = dict(pod_list if pod_list is not None else recorded_pods())
        self.token = token
        self.page_size = page_size
        self.forbidden = False
        self.requests: list[tuple[str, dict[str, list[str]], str | None]] = []  # path, query, Authorization
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                query = parse_qs(url.query)
                outer.requests.append((url.path, query, self.headers.get("Authorization")))
                status, body = outer.answer(url.path, query, self.headers.get("Authorization"))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self._httpd.server_port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def answer(self, path: str, query: Mapping[str, list[str]], authorization: str | None) -> tuple[int, dict]:
        if self.token is not None and authorization != f"Bearer {self.token}":
            return 401, _status(401, "Unauthorized", "Unauthorized")
        if self.forbidden:
            user = "system:serviceaccount:gpuledger:gpuledger-agent"
            return 403, _status(403, "Forbidden", f'pods is forbidden: User "{user}" cannot list resource "pods" '
                                                  'in API group "" at the cluster scope')  # fmt: skip
        if path != "/api/v1/pods":
            return 404, _status(404, "NotFound", "the server could not find the requested resource")
        items = list(self.pod_list.get("items", []))
        for selector in query.get("fieldSelector", []):
            key, _, value = selector.partition("=")
            if key == "spec.nodeName":
                items = [i for i in items if i.get("spec", {}).get("nodeName") == value]
        start = int(query.get("continue", ["0"])[0])
        limit = int(query.get("limit", ["0"])[0]) or len(items)
        if self.page_size:
            limit = min(limit, self.page_size)
        page = items[start : start + limit]
        meta = {"resourceVersion": "918273"}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)  # opaque to the client; an offset here
        return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": page}

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "details": {"kind": "pods"}, "code": code}  # fmt: skip


def pod_log_dirs(root: Path, pods: Sequence[tuple[str, str, str]]) -> Path:
    """The kubelet's /var/log/pods for ``(namespace, name, uid)`` pods, each with a container's log."""
    for namespace, name, uid in pods:
        d = root / f"{namespace}_{name}_{uid}" / "main"
        d.mkdir(parents=True)
        (d / "0.log").write_text("")
    return root


def env_without_cluster(env: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """``env`` (default: this process's) less anything that points at a real cluster, plus ``extra``."""
    base = os.environ if env is None else env
    kept = {k: v for k, v in base.items() if not k.startswith(("KUBERNETES_", "GPULEDGER_KUBE", "NODE_NAME"))}
    return {**kept, **extra}
