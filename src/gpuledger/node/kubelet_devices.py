"""Which GPUs a pod holds, from what the kubelet's pod-resources API lists: pure functions, no I/O.

The kubelet reports each container's devices by the ids its device plugin advertised:

* the NVIDIA device plugin advertises a whole GPU by its UUID (``GPU-8f2c...``), the same string
  NVML gives;
* under a MIG strategy (``nvidia.com/mig-1g.10gb`` ...) a slice by its MIG UUID (``MIG-...``, or
  ``MIG-GPU-<uuid>/<gi>/<ci>`` from drivers before R470), again as NVML names it;
* with time-slicing or MPS sharing, the plugin advertises each GPU (or slice) ``n`` times as
  ``<id>::0`` ... ``<id>::<n-1>``; the kubelet hands each replica to a pod as if it were a device,
  so several pods hold one GPU. ``<id>::<k>`` is normalised to ``<id>``, and the replica kept.

Other plugins may advertise bare NVML indices (``0``): they are resolved against the node's GPU
list. An id that is neither is reported unresolved, never guessed (GKE's plugin, for one, names
devices after their /dev/nvidia<minor> files, and a minor number is not an NVML index).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# Extended resources that are NVIDIA GPUs or slices of them (the device plugin's names; a
# time-slicing config with renameByDefault advertises nvidia.com/gpu.shared).
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.*", "nvidia.com/mig-*")
REPLICA_SEPARATOR = "::"
_UUID_PREFIXES = ("GPU-", "MIG-")


@dataclass(frozen=True)
class DeviceGroup:
    """Devices of one extended resource (pod-resources ``ContainerDevices``)."""

    resource: str
    ids: tuple[str, ...]
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class DraDevice:
    """A device a container holds through a ResourceClaim (pod-resources ``ClaimResource``)."""

    claim: str  # "<namespace>/<claim name>"
    driver: str
    device: str
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class PodDevices:
    """One pod as the kubelet lists it: by namespace and name, since the API carries no UID."""

    namespace: str
    name: str
    containers: Mapping[str, tuple[DeviceGroup, ...]] = field(default_factory=dict)
    dra: Mapping[str, tuple[DraDevice, ...]] = field(default_factory=dict)  # container -> its claims' devices

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PodGpus:
    """The GPUs one pod holds, normalised to NVML UUIDs."""

    devices: Mapping[str, tuple[str, ...]]  # container -> GPU / MIG UUIDs, each once, in the kubelet's order
    replicas: Mapping[str, tuple[int, ...]]  # GPU -> the time-sliced replicas of it this pod holds
    unresolved: tuple[str, ...] = ()  # GPU device ids that name no GPU of this node

    def gpus(self) -> tuple[str, ...]:
        """Every GPU of every container, each once."""
        return tuple(dict.fromkeys(g for ids in self.devices.values() for g in ids))


class GpuNames:
    """The node's GPUs as NVML lists them: resolves a device id to the UUID NVML would report."""

    def __init__(self, gpus: Iterable[tuple[int, str]] = ()) -> None:
        self._by_folded: dict[str, str] = {}
        self._by_index: dict[int, str] = {}
        for index, uuid in gpus:
            self._by_folded[uuid.casefold()] = uuid
            if uuid.upper().startswith("GPU-"):  # a MIG slice shares its parent's index
                self._by_index.setdefault(index, uuid)

    def __bool__(self) -> bool:
        return bool(self._by_folded)

    def resolve(self, device_id: str) -> str | None:
        """The NVML UUID a device id (its replica suffix removed) names; None when it names none."""
        base = device_id.strip()
        known = self._by_folded.get(base.casefold())
        if known is not None:
            return known
        if base.upper().startswith(_UUID_PREFIXES):
            return base  # a UUID of a GPU NVML does not list (yet): still the pod's claim
        if base.isdigit():
            return self._by_index.get(int(base))
        return None


def split_replica(device_id: str) -> tuple[str, int | None]:
    """``"GPU-x::3"`` → ``("GPU-x", 3)``; an id without a replica suffix → ``(id, None)``."""
    base, sep, rest = device_id.partition(REPLICA_SEPARATOR)
    if not sep or not rest.isdigit():
        return device_id, None
    return base, int(rest)


def is_gpu_resource(resource: str, patterns: Sequence[str] = GPU_RESOURCES) -> bool:
    return any(fnmatch.fnmatchcase(resource, p) for p in patterns)


def _looks_like_gpu(base: str) -> bool:
    return base.upper().startswith(_UUID_PREFIXES)


def pod_gpus(pod: PodDevices, names: GpuNames, patterns: Sequence[str] = GPU_RESOURCES) -> PodGpus:
    """The GPUs of each container of ``pod``. A device counts as a GPU when its resource is one of
    ``patterns`` or its id is a GPU or MIG UUID (a plugin config may rename the resource)."""
    devices: dict[str, tuple[str, ...]] = {}
    replicas: dict[str, list[int]] = {}
    unresolved: list[str] = []
    for container, groups in pod.containers.items():
        found: list[str] = []
        for group in groups:
            gpu_resource = is_gpu_resource(group.resource, patterns)
            for device_id in group.ids:
                base, replica = split_replica(device_id)
                if not gpu_resource and not _looks_like_gpu(base):
                    continue  # a NIC, an FPGA ...: not ours to meter
                uuid = names.resolve(base)
                if uuid is None:
                    unresolved.append(device_id)
                    continue
                found.append(uuid)
                if replica is not None:
                    replicas.setdefault(uuid, []).append(replica)
        if found:
            devices[container] = tuple(dict.fromkeys(found))
    return PodGpus(
        devices=devices,
        replicas={g: tuple(sorted(set(r))) for g, r in replicas.items()},
        unresolved=tuple(dict.fromkeys(unresolved)),
    )


def dra_gpu_devices(pod: PodDevices) -> tuple[DraDevice, ...]:
    """Devices of NVIDIA DRA drivers (``gpu.nvidia.com`` ...): named by the driver's own device
    names, which the API does not tie to NVML UUIDs, so they are counted and reported, not resolved."""
    return tuple(d for devs in pod.dra.values() for d in devs if "nvidia" in d.driver.lower())


def allocatable_gpus(groups: Iterable[DeviceGroup], names: GpuNames,
                     patterns: Sequence[str] = GPU_RESOURCES) -> dict[str, int]:  # fmt: skip
    """GPU UUID → how many pods the kubelet may place on it (1: whole; n: n time-sliced replicas)."""
    counts: dict[str, set[str]] = {}
    for group in groups:
        gpu_resource = is_gpu_resource(group.resource, patterns)
        for device_id in group.ids:
            base, _ = split_replica(device_id)
            if not gpu_resource and not _looks_like_gpu(base):
                continue
            uuid = names.resolve(base)
            if uuid is not None:
                counts.setdefault(uuid, set()).add(device_id)
    return {uuid: len(ids) for uuid, ids in counts.items()}


def shared_gpus(holders: Mapping[str, Iterable[str]]) -> dict[str, tuple[str, ...]]:
    """GPU → the pods holding it, for the GPUs more than one pod holds (``holders``: pod → GPUs)."""
    by_gpu: dict[str, list[str]] = {}
    for pod, gpus in holders.items():
        for gpu in dict.fromkeys(gpus):
            by_gpu.setdefault(gpu, []).append(pod)
    return {gpu: tuple(sorted(pods)) for gpu, pods in by_gpu.items() if len(pods) > 1}
