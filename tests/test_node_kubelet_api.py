"""Pod identity from the API server (a local HTTP server answering a recorded pod list) and from the
node itself (the runtime's container labels, the kubelet's pod log directories)."""

from __future__ import annotations

import datetime
import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpuledger.node.kubelet_api import ApiConfig, ApiError, ApiServerClient, api_config, pod_identity
from gpuledger.node.kubelet_runtime import identities_from_containers, identities_from_log_dirs
from kubelet_support import NODE, ApiServer, pod_log_dirs, recorded_pods

TRAIN_UID = "3f9a1c2e-7b4d-4e8f-9a1b-2c3d4e5f6a7b"


@pytest.fixture
def server() -> Iterator[ApiServer]:
    s = ApiServer()
    yield s
    s.close()


def client_for(server: ApiServer, tmp_path: Path, token: str = "sa-token-1", ca: Path | None = None) -> ApiServerClient:
    token_file = tmp_path / "token"
    token_file.write_text(token)
    return ApiServerClient(ApiConfig(server.url, str(token_file), str(ca) if ca else None), timeout_s=5)


# -- listing -------------------------------------------------------------------------------------------
def test_the_pods_of_this_node_come_with_labels_and_qos(server: ApiServer, tmp_path: Path) -> None:
    client = client_for(server, tmp_path)
    pods = {p.uid: p for p in client.pods_on_node(NODE)}
    assert len(pods) == 5  # the sixth pod of the recording runs on another node
    train = pods[TRAIN_UID]
    assert (train.namespace, train.name, train.qos, train.source) == ("ml", "train-yolo-0", "Guaranteed", "api")
    assert train.labels["project"] == "defect-detection"
    assert {p.qos for p in pods.values()} == {"Guaranteed", "Burstable", "BestEffort"}
    path, query, authorization = server.requests[0]
    assert path == "/api/v1/pods" and query["fieldSelector"] == [f"spec.nodeName={NODE}"]
    assert authorization == "Bearer sa-token-1"


def test_a_long_list_is_read_page_by_page(server: ApiServer, tmp_path: Path) -> None:
    server.page_size = 2
    assert len(client_for(server, tmp_path).pods_on_node(NODE)) == 5
    assert [q.get("continue") for _, q, _ in server.requests] == [None, ["2"], ["4"]]


def test_a_rotated_token_is_read_again(server: ApiServer, tmp_path: Path) -> None:
    client = client_for(server, tmp_path)
    client.pods_on_node(NODE)
    (tmp_path / "token").write_text("sa-token-2\n")  # the kubelet rotates projected tokens in place
    server.token = "sa-token-2"
    assert len(client.pods_on_node(NODE)) == 5


def test_an_rbac_refusal_names_the_fix(server: ApiServer, tmp_path: Path) -> None:
    server.forbidden = True
    with pytest.raises(ApiError) as caught:
        client_for(server, tmp_path).pods_on_node(NODE)
    assert caught.value.status == 403
    message = str(caught.value)
    assert 'cannot list resource "pods"' in message  # the API server's own words
    assert "needs get/list/watch on pods (deploy/kubernetes/rbac.yaml)" in message
    assert "\n" not in message


def test_credentials_the_api_server_rejects_are_said(server: ApiServer, tmp_path: Path) -> None:
    with pytest.raises(ApiError, match=r"did not accept the agent's credentials \(401"):
        client_for(server, tmp_path, token="expired").pods_on_node(NODE)


def test_an_api_server_that_is_not_there_is_said(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
        client = ApiServerClient(ApiConfig(f"http://127.0.0.1:{port}"), timeout_s=2)
        with pytest.raises(ApiError, match=rf"API server http://127.0.0.1:{port} unreachable"):
            client.pods_on_node(NODE)


def test_a_pod_object_without_identity_is_skipped() -> None:
    assert pod_identity({"metadata": {"name": "x", "namespace": "y"}}) is None
    assert pod_identity({"kind": "Status"}) is None
    doc = recorded_pods()["items"][0]
    assert pod_identity(doc).uid == TRAIN_UID


# -- TLS with the cluster's CA ----------------------------------------------------------------------------
def _self_signed(tmp_path: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def test_https_is_verified_against_the_service_accounts_ca(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path, "kube-apiserver")
    other, _ = _self_signed(tmp_path, "someone-else")
    server = ApiServer(tls=(cert, key))
    try:
        assert len(client_for(server, tmp_path, ca=cert).pods_on_node(NODE)) == 5
        with pytest.raises(ApiError, match="TLS verification failed"):
            client_for(server, tmp_path, ca=other).pods_on_node(NODE)
    finally:
        server.close()


# -- finding the API server -----------------------------------------------------------------------------
def _service_account(tmp_path: Path, *, token: bool = True) -> Path:
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    if token:
        (sa / "token").write_text("sa-token-1")
    (sa / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    return sa


def test_in_a_cluster_the_service_account_and_service_address_are_used(tmp_path: Path) -> None:
    sa = _service_account(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    config, why = api_config(env, str(sa))
    assert why is None
    assert config == ApiConfig("https://10.96.0.1:443", str(sa / "token"), str(sa / "ca.crt"))
    config, _ = api_config({"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "6443"}, str(sa))
    assert config is not None and config.base_url == "https://[fd00:10:96::1]:6443"


def test_without_a_token_or_a_cluster_it_says_why(tmp_path: Path) -> None:
    sa = _service_account(tmp_path, token=False)
    config, why = api_config({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, str(sa))
    assert config is None and "no service-account token" in (why or "")
    config, why = api_config({}, str(sa))
    assert config is None and "not running in a cluster" in (why or "") and "GPULEDGER_KUBE_API" in (why or "")


def test_an_explicit_api_url_wins_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    sa = _service_account(tmp_path)
    config, _ = api_config({"GPULEDGER_KUBE_API": "http://127.0.0.1:8001/", "KUBERNETES_SERVICE_HOST": "x"}, str(sa))
    assert config is not None and config.base_url == "http://127.0.0.1:8001" and config.ca_path is None
    config, why = api_config({"GPULEDGER_KUBE_API": "127.0.0.1:8001"}, str(sa))
    assert config is None and "is not an http:// or https:// URL" in (why or "")


# -- the node's own records -----------------------------------------------------------------------------
# GET /containers/json as Docker answers it for a pod run through cri-dockerd: the sandbox ("POD")
# carries the pod's labels and, prefixed "annotation.", its annotations; the app container only
# the io.kubernetes.* keys.
CRI_DOCKERD_CONTAINERS = [
    {
        "Id": "9c1d" * 16,
        "Names": ["/k8s_main_train-yolo-0_ml_3f9a1c2e-7b4d-4e8f-9a1b-2c3d4e5f6a7b_0"],
        "Image": "registry.example/ml/trainer:1.4",
        "State": "running",
        "Labels": {
            "io.kubernetes.container.name": "main",
            "io.kubernetes.docker.type": "container",
            "io.kubernetes.pod.name": "train-yolo-0",
            "io.kubernetes.pod.namespace": "ml",
            "io.kubernetes.pod.uid": TRAIN_UID,
            "io.kubernetes.sandbox.id": "5a2b" * 16,
        },
    },
    {
        "Id": "5a2b" * 16,
        "Names": ["/k8s_POD_train-yolo-0_ml_3f9a1c2e-7b4d-4e8f-9a1b-2c3d4e5f6a7b_0"],
        "Image": "registry.k8s.io/pause:3.9",
        "State": "running",
        "Labels": {
            "annotation.kubernetes.io/config.seen": "2025-03-14T09:21:07.0Z",
            "app": "train",
            "io.kubernetes.container.name": "POD",
            "io.kubernetes.docker.type": "podsandbox",
            "io.kubernetes.pod.name": "train-yolo-0",
            "io.kubernetes.pod.namespace": "ml",
            "io.kubernetes.pod.uid": TRAIN_UID,
            "project": "defect-detection",
            "team": "vision",
        },
    },
    {"Id": "77" * 32, "Names": ["/registry"], "State": "running", "Labels": {"maintainer": "ops"}},
]


def test_the_runtimes_sandbox_labels_name_a_pod_and_carry_its_labels() -> None:
    (pod,) = identities_from_containers(CRI_DOCKERD_CONTAINERS)
    assert (pod.uid, pod.namespace, pod.name, pod.source) == (TRAIN_UID, "ml", "train-yolo-0", "docker")
    assert pod.labels == {"app": "train", "project": "defect-detection", "team": "vision"}
    (only_app,) = identities_from_containers(CRI_DOCKERD_CONTAINERS[:1])  # sandbox not listed: a name, no labels
    assert only_app.labels == {} and only_app.uid == TRAIN_UID


def test_the_kubelets_pod_log_directories_name_pods(tmp_path: Path) -> None:
    root = pod_log_dirs(
        tmp_path / "pods",
        [("ml", "train-yolo-0", TRAIN_UID), ("kube-system", "coredns-5d78c", "a" * 8 + "-1111-4222-8333-" + "b" * 12)],
    )
    (root / "not-a-pod-dir").mkdir()
    pods = {p.uid: p for p in identities_from_log_dirs(str(root))}
    assert set(pods) == {TRAIN_UID, "aaaaaaaa-1111-4222-8333-bbbbbbbbbbbb"}
    assert (pods[TRAIN_UID].namespace, pods[TRAIN_UID].name, pods[TRAIN_UID].source) == (
        "ml",
        "train-yolo-0",
        "pod-logs",
    )
    assert identities_from_log_dirs(str(tmp_path / "missing")) == []
