"""deploy/kubernetes/: the manifests parse, say what docs/AGENT.md promises (hostPID, read-only
host mounts, NODE_NAME, read-only RBAC, /metrics), and hand the agent options it accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuledger.cli.agent_cmd import agent_cmd

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"
READ_VERBS = {"get", "list", "watch"}


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def everything() -> dict[str, list[dict[str, Any]]]:
    kinds: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in documents(path.name):
            kinds.setdefault(doc["kind"], []).append(doc)
    return kinds


@pytest.fixture(scope="module")
def daemonset() -> dict[str, Any]:
    (ds,) = everything()["DaemonSet"]
    return ds


@pytest.fixture(scope="module")
def agent(daemonset) -> dict[str, Any]:
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    return container


def options(container: dict[str, Any]) -> dict[str, Any]:
    """The container's arguments as the real `gpuledger agent` command parses them."""
    assert container["command"] == ["gpuledger", "agent"]
    ctx = agent_cmd.make_context("agent", list(container["args"]))
    return dict(ctx.params)


def mounts(container: dict[str, Any], spec: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """mountPath -> (host path, read-only)."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    out = {}
    for m in container["volumeMounts"]:
        host = volumes[m["name"]].get("hostPath", {}).get("path")
        out[m["mountPath"]] = (host, bool(m.get("readOnly")))
    return out


def test_every_manifest_is_a_kubernetes_object_and_kustomize_lists_them() -> None:
    kinds = everything()
    assert set(kinds) == {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "Service",
                          "Kustomization", "PodMonitor"}  # fmt: skip
    for docs in kinds.values():
        for doc in docs:
            assert doc.get("apiVersion") and (doc["kind"] == "Kustomization" or doc["metadata"]["name"])
    (kustomization,) = kinds["Kustomization"]
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml", "podmonitor.yaml"}
    assert all((DEPLOY / name).is_file() for name in listed)


def test_the_daemonset_sees_host_pids_and_the_kubelet_read_only(daemonset, agent) -> None:
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    assert spec["nodeSelector"]  # GPU nodes only
    assert (
        daemonset["spec"]["selector"]["matchLabels"].items()
        <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    )
    got = mounts(agent, spec)
    params = options(agent)
    socket_dir = str(Path(params["kubelet_socket"]).parent)
    assert got[socket_dir] == ("/var/lib/kubelet/pod-resources", True)  # the directory: it survives restarts
    assert got[params["proc_root"]] == ("/proc", True)
    assert got[params["cgroup_root"]] == ("/sys/fs/cgroup", True)
    assert got["/var/log/pods"] == ("/var/log/pods", True)
    writable = [path for path, (_, ro) in got.items() if not ro]
    assert sorted(writable) == ["/tmp", "/var/lib/gpuledger"]  # its ledger and scratch space only


def test_the_agent_knows_its_node_and_keeps_its_ledger_on_the_node(agent) -> None:
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    params = options(agent)
    assert params["db"].startswith(env["GPULEDGER_HOME"]["value"] + "/")
    assert "nvidia.com/gpu" not in str(agent["resources"])  # it must not take a GPU from the workloads


def test_resources_and_security_context_are_bounded(agent) -> None:
    resources = agent["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"} and set(resources["limits"]) == {"cpu", "memory"}
    security = agent["securityContext"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    assert sorted(security["capabilities"]["add"]) == ["DAC_READ_SEARCH", "SYS_PTRACE"]


def test_rbac_reads_pods_and_nothing_else(daemonset) -> None:
    kinds = everything()
    (role,) = kinds["ClusterRole"]
    for rule in role["rules"]:
        assert set(rule["verbs"]) <= READ_VERBS, rule
        assert rule["resources"] == ["pods"] and rule["apiGroups"] == [""]
        assert "*" not in str(rule)
    (binding,) = kinds["ClusterRoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}  # fmt: skip
    (account,) = kinds["ServiceAccount"]
    namespace = daemonset["metadata"]["namespace"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": namespace}]  # fmt: skip
    assert daemonset["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    assert account["metadata"]["namespace"] == namespace == kinds["Namespace"][0]["metadata"]["name"]


def test_metrics_are_served_where_the_service_and_annotations_say(daemonset, agent) -> None:
    params = options(agent)
    port = params["metrics_port"]
    assert params["metrics_host"] == "0.0.0.0"  # reachable on the pod's IP
    assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in agent["ports"]
    (service,) = everything()["Service"]
    assert service["spec"]["clusterIP"] == "None"  # headless: one endpoint per node's agent
    assert service["spec"]["selector"].items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["port"] == port and service["spec"]["ports"][0]["targetPort"] == "metrics"
    for said in (service["metadata"]["annotations"], daemonset["spec"]["template"]["metadata"]["annotations"]):
        assert said["prometheus.io/scrape"] == "true" and said["prometheus.io/port"] == str(port)
    (monitor,) = everything()["PodMonitor"]
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
