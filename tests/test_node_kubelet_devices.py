"""Device ids as device plugins advertise them, normalised to the UUIDs NVML reports (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuledger.node.kubelet_devices import (
    DeviceGroup,
    GpuNames,
    PodDevices,
    allocatable_gpus,
    is_gpu_resource,
    pod_gpus,
    shared_gpus,
    split_replica,
)

GPU = "GPU-1f8c2a9e-56a1-4d7c-9a0b-3c1e2f4d5a6b"
GPU2 = "GPU-7d3e9b10-2c4f-48a6-b1e2-9f0a8c7d6e5f"
MIG = "MIG-5e6f7a8b-9c0d-5e1f-a2b3-c4d5e6f7a8b9"
OLD_MIG = "MIG-GPU-a0b1c2d3-e4f5-4a6b-8c9d-0e1f2a3b4c5d/1/0"  # drivers before R470
NAMES = GpuNames([(0, GPU), (1, GPU2), (1, MIG), (1, OLD_MIG)])


def pod(*groups: DeviceGroup, container: str = "main") -> PodDevices:
    return PodDevices("ml", "p", {container: groups})


def test_replica_suffixes_are_split_off() -> None:
    assert split_replica(f"{GPU}::3") == (GPU, 3)
    assert split_replica(GPU) == (GPU, None)
    assert split_replica(f"{MIG}::0") == (MIG, 0)
    assert split_replica("odd::name") == ("odd::name", None)  # not a replica number: the id as given


@given(st.integers(min_value=0, max_value=10_000))
def test_any_replica_of_a_gpu_is_that_gpu(n: int) -> None:
    replicated = pod_gpus(pod(DeviceGroup("nvidia.com/gpu.shared", (f"{GPU}::{n}",))), NAMES)
    whole = pod_gpus(pod(DeviceGroup("nvidia.com/gpu", (GPU,))), NAMES)
    assert replicated.devices == whole.devices == {"main": (GPU,)}
    assert replicated.replicas == {GPU: (n,)}


@given(st.lists(st.integers(min_value=0, max_value=64), min_size=1, max_size=20))
def test_replicas_of_one_gpu_count_once_as_a_gpu_and_each_as_a_replica(replicas: list[int]) -> None:
    ids = tuple(f"{GPU}::{r}" for r in replicas)
    got = pod_gpus(pod(DeviceGroup("nvidia.com/gpu.shared", ids)), NAMES)
    assert got.gpus() == (GPU,)
    assert got.replicas[GPU] == tuple(sorted(set(replicas)))
    assert allocatable_gpus([DeviceGroup("nvidia.com/gpu.shared", ids)], NAMES) == {GPU: len(set(replicas))}


def test_mig_uuids_old_and_new_are_kept_as_nvml_names_them() -> None:
    got = pod_gpus(pod(DeviceGroup("nvidia.com/mig-1g.10gb", (MIG, OLD_MIG))), NAMES)
    assert got.devices == {"main": (MIG, OLD_MIG)}


def test_case_and_indices_resolve_to_nvml_spelling() -> None:
    assert NAMES.resolve(GPU.upper()) == GPU == NAMES.resolve(GPU.lower())
    assert NAMES.resolve("1") == GPU2  # an index names a whole GPU, never one of its MIG slices
    assert NAMES.resolve("7") is None
    assert NAMES.resolve("nvidia0") is None  # a /dev/nvidia<minor> name is not an NVML index


def test_a_uuid_nvml_does_not_list_is_still_the_pods_claim() -> None:
    unknown = "GPU-00000000-0000-4000-8000-000000000000"
    assert pod_gpus(pod(DeviceGroup("nvidia.com/gpu", (unknown,))), NAMES).gpus() == (unknown,)


def test_other_devices_are_not_gpus_unless_their_ids_are_gpu_uuids() -> None:
    got = pod_gpus(
        pod(DeviceGroup("example.com/nic", ("eth1", "0")), DeviceGroup("vendor.example/accel", (GPU2,))), NAMES
    )
    assert got.devices == {"main": (GPU2,)}  # a renamed GPU resource still counts; the NIC's "0" does not
    assert got.unresolved == ()


def test_gpu_ids_that_name_nothing_are_unresolved() -> None:
    got = pod_gpus(pod(DeviceGroup("nvidia.com/gpu", ("nvidia0", GPU))), NAMES)
    assert got.devices == {"main": (GPU,)} and got.unresolved == ("nvidia0",)


def test_gpu_resources_are_nvidias_names() -> None:
    for name in ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"):
        assert is_gpu_resource(name)
    for name in ("example.com/gpu", "nvidia.com/hostdev", "amd.com/gpu"):
        assert not is_gpu_resource(name)


def test_only_gpus_held_by_more_than_one_pod_are_shared() -> None:
    assert shared_gpus({"ml/a": (GPU,), "ml/b": (GPU, GPU2), "ml/c": (MIG,)}) == {GPU: ("ml/a", "ml/b")}
