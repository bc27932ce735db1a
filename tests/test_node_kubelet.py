"""The Kubernetes adapter against a fake kubelet (grpcio on a unix socket) and a local API server.

What a user of ``gpuledger agent`` on a Kubernetes node would notice: which pod is allocated which
GPU (whole, MIG slice, time-sliced replica), that pods are named and labelled, that the adapter
rides out a kubelet restart with its last allocations marked stale, and that a missing socket,
something else on the socket, RBAC or a missing extra each get one clear status line.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import pytest

from ci_support import missing

if find_spec("grpc") is None:  # a dropped extra fails in CI, never skips there
    missing("the kubernetes extra (grpcio)", "pip install 'gpuledger[kubernetes]'")

from gpuledger.node.claims import Allocation, SourceOptions
from gpuledger.node.kubelet import KubeletSource, open_source
from gpuledger.node.kubelet_api import ApiConfig, ApiServerClient
from gpuledger.node.sources import load_sources
from kubelet_support import (
    GPU_A,
    GPU_B,
    MIG_1,
    NODE,
    NODE_GPUS,
    ApiServer,
    Container,
    FakeKubelet,
    GarbageSocket,
    Pod,
    env_without_cluster,
    pod_log_dirs,
)

UID_TRAIN = "3f9a1c2e-7b4d-4e8f-9a1b-2c3d4e5f6a7b"
UID_INFER = "8b2e4f6a-1c3d-4e5f-a6b7-c8d9e0f1a2b3"
UID_ALICE = "c1d2e3f4-a5b6-4c7d-8e9f-a0b1c2d3e4f5"
UID_BOB = "d4e5f6a7-b8c9-4d0e-8f1a-2b3c4d5e6f70"
UID_PLUGIN = "e5f6a7b8-c9d0-4e1f-9a2b-3c4d5e6f7a8b"

# What the kubelet lists on the recorded node: a whole GPU, a MIG slice, one GPU time-sliced
# between two notebooks, and a pod without devices (the device plugin itself).
NODE_PODS = [
    Pod("ml", "train-yolo-0", [Container("main", [("nvidia.com/gpu", [GPU_A]), ("example.com/nic", ["eth1"])])]),
    Pod("ml", "infer-mig-5d9c7", [Container("main", [("nvidia.com/mig-1g.10gb", [MIG_1])])]),
    Pod("research", "notebook-alice", [Container("main", [("nvidia.com/gpu.shared", [f"{GPU_B}::0"])])]),
    Pod("research", "notebook-bob", [Container("main", [("nvidia.com/gpu.shared", [f"{GPU_B}::3"])])]),
    Pod("kube-system", "nvidia-device-plugin-x7k2p", [Container("nvidia-device-plugin-ctr")]),
]
NODE_ALLOCATABLE = [
    ("nvidia.com/gpu", [GPU_A]),
    ("nvidia.com/gpu.shared", [f"{GPU_B}::{i}" for i in range(4)]),
    ("nvidia.com/mig-1g.10gb", [MIG_1]),
    ("example.com/nic", ["eth1", "eth2"]),
]


class Clock:
    """The adapter's monotonic clock, moved by the test: backoff without sleeping."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    return tmp_path / "pod-resources" / "kubelet.sock"


@pytest.fixture
def kubelet(sock: Path) -> Iterator[FakeKubelet]:
    sock.parent.mkdir(exist_ok=True)
    fake = FakeKubelet(sock, NODE_PODS, NODE_ALLOCATABLE).start()
    yield fake
    fake.stop()


@pytest.fixture
def api() -> Iterator[ApiServer]:
    server = ApiServer()
    yield server
    server.close()


def api_client(server: ApiServer, tmp_path: Path, token: str = "sa-token-1") -> ApiServerClient:
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    return ApiServerClient(ApiConfig(server.url, str(token_file), None, "test"))


def make_source(sock: Path, **kw) -> KubeletSource:
    kw.setdefault("gpus", NODE_GPUS)
    kw.setdefault("node_name", NODE)
    return KubeletSource(str(sock), **kw)


def allocations(source: KubeletSource) -> set[tuple[str, str, str]]:
    return {(a.gpu, a.kind, a.owner) for a in source.claims(0.0).allocations}


# -- who holds which GPU --------------------------------------------------------------------------------
def test_whole_mig_and_time_sliced_gpus_become_pod_allocations(kubelet, api, sock, tmp_path) -> None:
    source = make_source(sock, api=api_client(api, tmp_path))
    try:
        claims = source.claims(0.0)
        assert {(a.gpu, a.owner) for a in claims.allocations} == {
            (GPU_A, UID_TRAIN),
            (MIG_1, UID_INFER),
            (GPU_B, UID_ALICE),  # "<uuid>::0" is the GPU itself
            (GPU_B, UID_BOB),
        }
        assert all(isinstance(a, Allocation) and a.kind == "pod" for a in claims.allocations)
        train = claims.pods[UID_TRAIN]
        assert (train.namespace, train.name, train.qos) == ("ml", "train-yolo-0", "Guaranteed")
        assert train.devices == {"main": (GPU_A,)}  # the NIC is not a GPU
        assert train.labels["team"] == "vision" and train.labels["model_version"] == "yolov10s"
        assert claims.pods[UID_ALICE].devices == {"main": (GPU_B,)}
        assert claims.pods[UID_PLUGIN].devices == {}  # named and labelled, holding nothing
        assert "f6a7b8c9-d0e1-4f2a-8b3c-4d5e6f7a8b9c" not in claims.pods  # a pod of another node
        assert source.status() is None
    finally:
        source.close()


def test_a_gpu_time_sliced_between_pods_is_reported_as_shared(kubelet, api, sock, tmp_path) -> None:
    source = make_source(sock, api=api_client(api, tmp_path))
    try:
        source.claims(0.0)
        assert source.sharing() == {GPU_B: ("research/notebook-alice", "research/notebook-bob")}
        assert source.replicas() == {"research/notebook-alice": {GPU_B: (0,)}, "research/notebook-bob": {GPU_B: (3,)}}
        assert source.allocatable() == {GPU_A: 1, GPU_B: 4, MIG_1: 1}
    finally:
        source.close()


def test_device_ids_are_matched_to_nvml_spelling_and_indices_resolved(sock, kubelet, tmp_path) -> None:
    kubelet.pods = [
        Pod("ml", "upper", [Container("main", [("nvidia.com/gpu", [GPU_A.upper()])])]),
        Pod("ml", "by-index", [Container("main", [("nvidia.com/gpu", ["1"])])]),
    ]
    logs = pod_log_dirs(tmp_path / "pods", [("ml", "upper", UID_TRAIN), ("ml", "by-index", UID_INFER)])
    source = make_source(sock, pod_log_root=str(logs))
    try:
        assert {(a.gpu, a.owner) for a in source.claims(0.0).allocations} == {(GPU_A, UID_TRAIN), (GPU_B, UID_INFER)}
    finally:
        source.close()


def test_a_pod_recreated_under_its_name_is_the_newest_one(sock, kubelet, tmp_path) -> None:
    kubelet.pods = NODE_PODS[:1]  # ml/train-yolo-0, as a StatefulSet recreates it
    logs = pod_log_dirs(tmp_path / "pods", [("ml", "train-yolo-0", UID_BOB), ("ml", "train-yolo-0", UID_TRAIN)])
    os.utime(logs / f"ml_train-yolo-0_{UID_BOB}", (1e9, 1e9))  # the old pod's directory, not yet removed
    source = make_source(sock, pod_log_root=str(logs))
    try:
        assert allocations(source) == {(GPU_A, "pod", UID_TRAIN)}
    finally:
        source.close()


def test_device_ids_that_name_no_gpu_are_said_not_guessed(sock, kubelet, tmp_path) -> None:
    kubelet.pods = [Pod("ml", "gke-style", [Container("main", [("nvidia.com/gpu", ["nvidia0"])])])]
    logs = pod_log_dirs(tmp_path / "pods", [("ml", "gke-style", UID_TRAIN)])
    source = make_source(sock, pod_log_root=str(logs))
    try:
        assert source.claims(0.0).allocations == []
        assert "device ids nvidia0 of pod ml/gke-style name no GPU of this node" in (source.status() or "")
    finally:
        source.close()


def test_gpus_held_through_dynamic_resource_allocation_are_reported(sock, kubelet, tmp_path) -> None:
    kubelet.pods = [Pod("ml", "dra-train", [Container("main", dra=[("gpu-claim", "gpu.nvidia.com", "gpu-0")])])]
    logs = pod_log_dirs(tmp_path / "pods", [("ml", "dra-train", UID_TRAIN)])
    source = make_source(sock, pod_log_root=str(logs))
    try:
        source.claims(0.0)
        assert "pod ml/dra-train holds GPUs through dynamic resource allocation (gpu.nvidia.com)" in (
            source.status() or ""
        )
    finally:
        source.close()


def test_an_old_kubelet_without_allocatable_resources_still_gives_allocations(sock, kubelet, api, tmp_path) -> None:
    kubelet.serve_allocatable = False
    source = make_source(sock, api=api_client(api, tmp_path))
    try:
        assert (GPU_A, "pod", UID_TRAIN) in allocations(source)
        assert source.allocatable() is None
        assert "does not serve GetAllocatableResources" in (source.status() or "")
    finally:
        source.close()


def test_an_upgraded_kubelet_is_asked_for_allocatable_resources_again(sock, kubelet, api, tmp_path) -> None:
    clock = Clock()
    kubelet.serve_allocatable = False
    source = make_source(sock, api=api_client(api, tmp_path), monotonic=clock)
    try:
        source.claims(0.0)
        assert source.allocatable() is None
        kubelet.stop()
        clock.t += 2
        source.claims(0.0)
        kubelet.serve_allocatable = True  # restarted as a newer kubelet
        kubelet.start()
        clock.t += 60
        source.claims(0.0)
        assert source.allocatable() == {GPU_A: 1, GPU_B: 4, MIG_1: 1}
    finally:
        source.close()


# -- pod identity ---------------------------------------------------------------------------------------
def test_a_pod_the_api_server_has_not_listed_yet_is_named_on_the_next_try(sock, kubelet, api, tmp_path) -> None:
    clock = Clock()
    api.pod_list = {"items": [p for p in api.pod_list["items"] if p["metadata"]["name"] != "train-yolo-0"]}
    source = make_source(sock, api=api_client(api, tmp_path), monotonic=clock)
    try:
        assert UID_TRAIN not in {a.owner for a in source.claims(0.0).allocations}
        assert "GPUs of pod ml/train-yolo-0 not attributed" in (source.status() or "")
        api.pod_list = ApiServer().pod_list  # the API server catches up
        clock.t += 6  # sooner than the periodic refresh: the kubelet named a pod nobody knows
        assert (GPU_A, "pod", UID_TRAIN) in allocations(source)
        assert source.status() is None
    finally:
        source.close()


def test_a_secret_in_a_pod_label_is_redacted(sock, kubelet, api, tmp_path) -> None:
    api.pod_list["items"][0]["metadata"]["labels"]["wandb_api_key"] = "0123456789abcdef0123456789abcdef01234567"
    source = make_source(sock, api=api_client(api, tmp_path))
    try:
        labels = source.claims(0.0).pods[UID_TRAIN].labels
        assert labels["wandb_api_key"].startswith("[REDACTED:") and labels["team"] == "vision"
        assert "0123456789abcdef" not in str(source.claims(0.0))
    finally:
        source.close()


def test_an_rbac_refusal_is_said_and_the_node_names_its_pods(sock, kubelet, api, tmp_path) -> None:
    api.forbidden = True
    logs = pod_log_dirs(tmp_path / "pods", [("ml", "train-yolo-0", UID_TRAIN)])
    source = make_source(sock, api=api_client(api, tmp_path), pod_log_root=str(logs))
    try:
        claims = source.claims(0.0)
        assert (GPU_A, "pod", UID_TRAIN) in {(a.gpu, a.kind, a.owner) for a in claims.allocations}
        assert claims.pods[UID_TRAIN].labels == {}  # the log directory gives no labels
        status = source.status() or ""
        assert "refused to list pods (403 Forbidden" in status and "get/list/watch on pods" in status
        assert "pod names from the kubelet's pod log directories" in status
        unnamed = "ml/infer-mig-5d9c7, research/notebook-alice, research/notebook-bob"
        assert f"GPUs of pods {unnamed} not attributed" in status
    finally:
        source.close()


def test_an_api_server_that_stops_answering_leaves_the_last_labels(sock, kubelet, api, tmp_path) -> None:
    clock = Clock()
    source = make_source(sock, api=api_client(api, tmp_path), monotonic=clock)
    try:
        assert source.claims(0.0).pods[UID_TRAIN].labels["team"] == "vision"
        api.close()
        clock.t += 31
        claims = source.claims(0.0)
        assert claims.pods[UID_TRAIN].labels["team"] == "vision"
        assert "unreachable" in (source.status() or "") and "pod labels as listed" in (source.status() or "")
    finally:
        source.close()


def test_without_node_name_the_api_server_is_not_asked_and_that_is_said(sock, kubelet, api, tmp_path) -> None:
    source = make_source(sock, api=api_client(api, tmp_path), node_name=None)
    try:
        source.claims(0.0)
        assert api.requests == []  # listing every pod of the cluster is not what the RBAC is for
        assert "NODE_NAME is not set" in (source.status() or "")
    finally:
        source.close()


# -- a kubelet that goes away --------------------------------------------------------------------------
def test_a_kubelet_restart_keeps_the_last_allocations_stale_then_reconnects(sock, kubelet, api, tmp_path) -> None:
    clock = Clock()
    source = make_source(sock, api=api_client(api, tmp_path), monotonic=clock)
    try:
        before = allocations(source)
        assert (GPU_A, "pod", UID_TRAIN) in before
        kubelet.stop()  # the kubelet restarts: its socket is gone
        clock.t += 2  # the next refresh
        assert allocations(source) == before  # what it last knew, not nothing
        status = source.status() or ""
        assert status.startswith("pod-resources unreachable for ") and "stale" in status
        assert "no pod-resources socket" in status

        restarted = FakeKubelet(sock, [Pod("ml", "train-yolo-0", [Container("main", [("nvidia.com/gpu", [GPU_B])])])])
        restarted.start()
        try:
            clock.t += 0.5  # within the backoff: the socket is not dialled yet
            assert allocations(source) == before and restarted.calls == []
            clock.t += 60
            assert allocations(source) == {(GPU_B, "pod", UID_TRAIN)}
            assert restarted.calls[:1] == ["List"]
            assert source.status() is None and source.reconnects == 1
        finally:
            restarted.stop()
    finally:
        source.close()


def test_the_socket_is_dialled_afresh_after_a_broken_answer(tmp_path) -> None:
    """A half-started kubelet (something on the socket, no gRPC yet) must not leave gRPC's own
    reconnect backoff, up to two minutes, deciding when the real one is seen."""
    clock = Clock()
    path = tmp_path / "kubelet.sock"
    garbage = GarbageSocket(path, b"HTTP/1.1 400 Bad Request\r\n\r\n")
    logs = pod_log_dirs(tmp_path / "pods", [("ml", "train-yolo-0", UID_TRAIN)])
    source = make_source(path, monotonic=clock, pod_log_root=str(logs))
    kubelet = FakeKubelet(path, NODE_PODS[:1])
    try:
        assert allocations(source) == set()
        garbage.close()
        kubelet.start()
        clock.t += 1
        assert allocations(source) == {(GPU_A, "pod", UID_TRAIN)}
    finally:
        kubelet.stop()
        source.close()


def test_the_backoff_doubles_while_the_kubelet_stays_away(sock, tmp_path) -> None:
    clock = Clock()
    source = make_source(sock, monotonic=clock, max_backoff_s=4.0)
    sock.parent.mkdir()
    fake = FakeKubelet(sock, NODE_PODS)
    try:
        source.claims(0.0)  # no socket: next try in 1 s, then 2, then 4 (the cap)
        clock.t += 1.0
        source.claims(0.0)
        clock.t += 2.0
        source.claims(0.0)
        fake.start()
        clock.t += 3.9
        source.claims(0.0)
        assert fake.calls == []
        clock.t += 0.2
        source.claims(0.0)
        assert fake.calls[:1] == ["List"]
    finally:
        fake.stop()
        source.close()


def test_no_socket_is_one_clear_line(tmp_path) -> None:
    source = make_source(tmp_path / "nowhere" / "kubelet.sock")
    try:
        claims = source.claims(0.0)
        assert claims.allocations == [] and claims.pods == {}
        status = source.status() or ""
        assert status.startswith("cannot see which pod holds which GPU: no pod-resources socket at ")
        assert ";" not in status  # a node without Kubernetes gets one line, not a lecture on RBAC
    finally:
        source.close()


def test_a_file_that_is_not_a_socket_is_said(tmp_path) -> None:
    path = tmp_path / "kubelet.sock"
    path.write_text("not a socket")
    source = make_source(path)
    try:
        source.claims(0.0)
        assert f"{path} is not a unix socket" in (source.status() or "")
    finally:
        source.close()


NOT_KUBELET = "does not answer as the kubelet's pod-resources API"


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", NOT_KUBELET),
        (b"\x00\xff garbage \x17" * 64, NOT_KUBELET),
        (None, "did not answer List within its deadline"),
    ],
    ids=["http1", "bytes", "silent"],
)
def test_something_else_on_the_socket_is_said(tmp_path, reply, said) -> None:
    path = tmp_path / "kubelet.sock"
    garbage = GarbageSocket(path, reply)
    source = make_source(path, call_timeout_s=0.5)
    try:
        claims = source.claims(0.0)
        assert claims.allocations == []
        assert said in (source.status() or "")
    finally:
        source.close()
        garbage.close()


# -- without the extra ----------------------------------------------------------------------------------
def test_without_grpcio_the_status_says_what_to_install_and_pods_are_still_named(
    monkeypatch, sock, kubelet, api, tmp_path
) -> None:
    monkeypatch.setitem(sys.modules, "grpc", None)  # import grpc now raises ImportError
    monkeypatch.delitem(sys.modules, "gpuledger.node.kubelet_grpc", raising=False)
    source = make_source(sock, api=api_client(api, tmp_path))
    try:
        claims = source.claims(0.0)
        assert claims.allocations == []
        assert claims.pods[UID_TRAIN].labels["project"] == "defect-detection"
        assert "install gpuledger[kubernetes]" in (source.status() or "")
        assert kubelet.calls == []
    finally:
        source.close()


# -- the agent's way in ---------------------------------------------------------------------------------
def test_the_agent_opens_it_from_kubelet_socket_and_the_environment(monkeypatch, sock, kubelet, api) -> None:
    for key in set(os.environ) - set(env_without_cluster()):
        monkeypatch.delenv(key)
    monkeypatch.setenv("GPULEDGER_KUBE_API", api.url)
    monkeypatch.setenv("NODE_NAME", NODE)
    api.token = None  # kubectl proxy adds the credentials itself
    options = SourceOptions(kubelet_socket=str(sock), docker_socket="none", gpus=NODE_GPUS)
    sources = load_sources(["kubelet"], options)
    sources.start()
    try:
        deadline = time.monotonic() + 30
        while sources.states()[0].answered_at is None and time.monotonic() < deadline:
            time.sleep(0.05)
        claims, _ = sources.claims()
        assert (GPU_A, "pod", UID_TRAIN) in {(a.gpu, a.kind, a.owner) for a in claims.allocations}
        assert claims.pods[UID_TRAIN].labels["team"] == "vision"
        assert sources.states()[0].status is None
        assert api.requests[0][1]["fieldSelector"] == [f"spec.nodeName={NODE}"]
    finally:
        sources.stop()


def test_open_source_names_its_gaps_outside_a_cluster(sock, kubelet) -> None:
    source = open_source(SourceOptions(kubelet_socket=str(sock), docker_socket="none"), env=env_without_cluster())
    try:
        assert source.name == "kubernetes"
        source.claims(0.0)
        status = source.status() or ""
        assert "pod labels unavailable: not running in a cluster (no KUBERNETES_SERVICE_HOST)" in status
        assert "GPULEDGER_KUBE_API" in status
    finally:
        source.close()
