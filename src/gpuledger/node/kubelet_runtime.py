"""Pod identity without the API server: what the node itself keeps about its pods.

The pod-resources API names pods by namespace and name only, while a process's cgroup path names
its pod by UID; the API server ties the two together. When it cannot be asked (outside a cluster,
or RBAC refused), two things on the node still do:

* the container runtime's labels. Under the Docker runtime (cri-dockerd, or dockershim before
  Kubernetes 1.24) every container of a pod carries ``io.kubernetes.pod.name`` / ``.namespace`` /
  ``.uid``; the pod's sandbox container (``io.kubernetes.docker.type=podsandbox``) also carries the
  pod's own labels, and its annotations prefixed ``annotation.``. The Docker Engine API's container
  list shows them (the Docker adapter's client, GET only);
* the kubelet's pod log directories, ``/var/log/pods/<namespace>_<name>_<uid>``, kept for every
  pod on the node whatever the runtime (names and namespaces cannot hold ``_``): UIDs, no labels.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from gpuledger.node.kubelet_api import PodIdentity

POD_LOG_ROOT = "/var/log/pods"
POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_UID = "io.kubernetes.pod.uid"
DOCKER_TYPE = "io.kubernetes.docker.type"
SANDBOX = "podsandbox"
_RUNTIME_PREFIXES = ("io.kubernetes.", "annotation.")
_LOG_DIR = re.compile(r"^(?P<ns>[a-z0-9][a-z0-9-]*)_(?P<name>[a-z0-9][a-z0-9.-]*)_(?P<uid>[0-9a-fA-F-]{32,36})$")


def identities_from_containers(summaries: Iterable[Mapping[str, Any]]) -> list[PodIdentity]:
    """Pods named by Docker's container list (``GET /containers/json``): one per pod UID, with the
    labels of its sandbox container when it is listed."""
    found: dict[str, PodIdentity] = {}
    for summary in summaries:
        labels = summary.get("Labels")
        if not isinstance(labels, Mapping):
            continue
        uid, namespace, name = labels.get(POD_UID), labels.get(POD_NAMESPACE), labels.get(POD_NAME)
        if not (isinstance(uid, str) and uid and isinstance(namespace, str) and isinstance(name, str)):
            continue
        pod_labels: dict[str, str] = {}
        if labels.get(DOCKER_TYPE) == SANDBOX:
            pod_labels = {str(k): str(v) for k, v in labels.items() if not str(k).startswith(_RUNTIME_PREFIXES)}
        known = found.get(uid)
        if known is None or (pod_labels and not known.labels):
            found[uid] = PodIdentity(uid, namespace, name, pod_labels, None, "docker")
    return list(found.values())


class DockerPodLister:
    """Pods named by a Docker daemon's container labels (``GET /containers/json`` only)."""

    def __init__(self, docker_host: str, *, timeout_s: float = 3.0) -> None:
        from gpuledger.node.docker_api import DockerClient

        self._client = DockerClient({"DOCKER_HOST": docker_host}, timeout_s=timeout_s)  # DockerConfigError: bad address

    def __call__(self) -> list[PodIdentity]:
        return identities_from_containers(self._client.containers(all=False))

    def close(self) -> None:
        self._client.close()


def identities_from_log_dirs(root: str = POD_LOG_ROOT) -> list[PodIdentity]:
    """Pods named by the kubelet's log directories under ``root``, oldest directory first (a pod
    recreated under the same name, as a StatefulSet's are, is its newest); [] when unreadable."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    dated = []
    for entry in entries:
        m = _LOG_DIR.match(entry.name)
        if m is None:
            continue
        try:
            made = entry.stat().st_mtime
        except OSError:
            continue  # removed while listed: the pod is gone
        identity = PodIdentity(m.group("uid").lower(), m.group("ns"), m.group("name"), {}, None, "pod-logs")
        dated.append((made, entry.name, identity))
    return [identity for _, _, identity in sorted(dated)]
