"""Pods named by a real Docker engine's container labels, as cri-dockerd labels a pod's containers,
when the API server cannot be asked (a private dockerd, tests/docker_support.py)."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from ci_support import missing

if find_spec("grpc") is None:  # a dropped extra fails in CI, never skips there
    missing("the kubernetes extra (grpcio)", "pip install 'gpuledger[kubernetes]'")

from docker_support import IMAGE, Engine
from gpuledger.node.claims import SourceOptions
from gpuledger.node.kubelet import open_source
from gpuledger.node.kubelet_runtime import DockerPodLister
from kubelet_support import GPU_A, NODE_GPUS, Container, FakeKubelet, Pod, env_without_cluster

UID = "3f9a1c2e-7b4d-4e8f-9a1b-2c3d4e5f6a7b"
POD = {"io.kubernetes.pod.name": "train-yolo-0", "io.kubernetes.pod.namespace": "ml", "io.kubernetes.pod.uid": UID}
# What cri-dockerd puts on a pod's sandbox: the pod's labels, its annotations prefixed, its identity.
SANDBOX = {**POD, "io.kubernetes.docker.type": "podsandbox", "io.kubernetes.container.name": "POD", "team": "vision",
           "project": "defect-detection", "annotation.kubernetes.io/config.source": "api"}  # fmt: skip
APP = {**POD, "io.kubernetes.docker.type": "container", "io.kubernetes.container.name": "main"}


def labelled(engine: Engine, labels: dict[str, str], name: str) -> str:
    args = [arg for k, v in labels.items() for arg in ("--label", f"{k}={v}")]
    return engine.run("--name", name, *args, IMAGE, "sleep", "300")


def test_the_sandbox_names_the_pod_and_carries_its_labels(engine: Engine) -> None:
    labelled(engine, APP, "k8s_main_train-yolo-0_ml_0")
    labelled(engine, SANDBOX, "k8s_POD_train-yolo-0_ml_0")
    engine.run("--name", "not-a-pod", IMAGE, "sleep", "300")
    lister = DockerPodLister(engine.env["DOCKER_HOST"])
    try:
        (pod,) = lister()
    finally:
        lister.close()
    assert (pod.uid, pod.namespace, pod.name, pod.source) == (UID, "ml", "train-yolo-0", "docker")
    assert pod.labels == {"team": "vision", "project": "defect-detection"}


def test_without_an_api_server_the_runtime_names_a_gpu_pod(engine: Engine, tmp_path: Path) -> None:
    labelled(engine, SANDBOX, "k8s_POD_train-yolo-0_ml_0")
    sock = tmp_path / "kubelet.sock"
    kubelet = FakeKubelet(sock, [Pod("ml", "train-yolo-0", [Container("main", [("nvidia.com/gpu", [GPU_A])])])])
    kubelet.start()
    options = SourceOptions(kubelet_socket=str(sock), docker_socket=engine.env["DOCKER_HOST"], gpus=NODE_GPUS)
    source = open_source(options, env=env_without_cluster())
    try:
        claims = source.claims(0.0)
        assert [(a.gpu, a.owner) for a in claims.allocations] == [(GPU_A, UID)]
        assert claims.pods[UID].labels["team"] == "vision"
        assert "pod names from the runtime's sandbox labels" in (source.status() or "")
    finally:
        source.close()
        kubelet.stop()
