"""The pod-resources wire contract: the proto says what the Kubernetes documentation says, and the
committed Python modules are what grpcio-tools generates from it today.

The table below is the documented API (the Kubernetes docs' "Monitoring device plugin resources"
and the v1 API reference): message → field → (number, type, repeated). A wrong number here would
decode the kubelet's answers into the wrong fields without any error, so every one is checked.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from ci_support import missing

if find_spec("grpc") is None:  # a dropped extra fails in CI, never skips there
    missing("the kubernetes extra (grpcio)", "pip install 'gpuledger[kubernetes]'")

from google.protobuf.descriptor import FieldDescriptor

from gpuledger.node import kubelet_podresources_pb2 as pb

SRC = Path(__file__).resolve().parents[1] / "src"
PROTO = "gpuledger/node/kubelet_podresources.proto"
STRING, INT64, UINT64, MESSAGE = (
    FieldDescriptor.TYPE_STRING,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_MESSAGE,
)

DOCUMENTED: dict[str, dict[str, tuple[int, int, bool]]] = {
    "ListPodResourcesRequest": {},
    "ListPodResourcesResponse": {"pod_resources": (1, MESSAGE, True)},
    "PodResources": {"name": (1, STRING, False), "namespace": (2, STRING, False), "containers": (3, MESSAGE, True)},
    "ContainerResources": {
        "name": (1, STRING, False),
        "devices": (2, MESSAGE, True),
        "cpu_ids": (3, INT64, True),
        "memory": (4, MESSAGE, True),
        "dynamic_resources": (5, MESSAGE, True),
    },
    "ContainerDevices": {
        "resource_name": (1, STRING, False),
        "device_ids": (2, STRING, True),
        "topology": (3, MESSAGE, False),
    },
    "ContainerMemory": {"memory_type": (1, STRING, False), "size": (2, UINT64, False), "topology": (3, MESSAGE, False)},
    "TopologyInfo": {"nodes": (1, MESSAGE, True)},
    "NUMANode": {"ID": (1, INT64, False)},
    "DynamicResource": {
        "class_name": (1, STRING, False),
        "claim_name": (2, STRING, False),
        "claim_namespace": (3, STRING, False),
        "claim_resources": (4, MESSAGE, True),
    },
    "ClaimResource": {
        "cdi_devices": (1, MESSAGE, True),
        "driver_name": (2, STRING, False),
        "pool_name": (3, STRING, False),
        "device_name": (4, STRING, False),
    },
    "CDIDevice": {"name": (1, STRING, False)},
    "AllocatableResourcesRequest": {},
    "AllocatableResourcesResponse": {
        "devices": (1, MESSAGE, True),
        "cpu_ids": (2, INT64, True),
        "memory": (3, MESSAGE, True),
    },
    "GetPodResourcesRequest": {"pod_name": (1, STRING, False), "pod_namespace": (2, STRING, False)},
    "GetPodResourcesResponse": {"pod_resources": (1, MESSAGE, False)},
}


def test_every_message_and_field_is_the_documented_one() -> None:
    messages = pb.DESCRIPTOR.message_types_by_name
    assert set(messages) == set(DOCUMENTED)
    for name, fields in DOCUMENTED.items():
        got = {f.name: (f.number, f.type, f.is_repeated) for f in messages[name].fields}
        assert got == fields, name


def test_the_service_is_addressed_as_the_kubelet_serves_it() -> None:
    assert pb.DESCRIPTOR.package == "v1"  # gRPC paths are /v1.PodResourcesLister/<Method>
    service = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert {m.name: (m.input_type.name, m.output_type.name) for m in service.methods} == {
        "List": ("ListPodResourcesRequest", "ListPodResourcesResponse"),
        "GetAllocatableResources": ("AllocatableResourcesRequest", "AllocatableResourcesResponse"),
        "Get": ("GetPodResourcesRequest", "GetPodResourcesResponse"),
    }


def test_known_bytes_decode_into_the_documented_fields() -> None:
    """A List answer encoded by hand from the field numbers (tag = number << 3 | wire type 2)."""

    def field(number: int, payload: bytes) -> bytes:
        return bytes([number << 3 | 2, len(payload)]) + payload

    devices = field(1, b"nvidia.com/gpu") + field(2, b"GPU-1::2")
    container = field(1, b"main") + field(2, devices)
    pod = field(1, b"train") + field(2, b"ml") + field(3, container)
    answer = pb.ListPodResourcesResponse.FromString(field(1, pod))
    (p,) = answer.pod_resources
    assert (p.name, p.namespace, p.containers[0].name) == ("train", "ml", "main")
    assert list(p.containers[0].devices[0].device_ids) == ["GPU-1::2"]
    assert p.containers[0].devices[0].resource_name == "nvidia.com/gpu"


# A generator of another version stamps its own version; everything else must be identical.
_VERSION_LINES = re.compile(r"^(# Protobuf Python Version: .*|\s+\d+,\s*$)", re.MULTILINE)


def _normalised(text: str) -> str:
    return _VERSION_LINES.sub("<version>", text)


def test_the_committed_modules_are_what_the_proto_generates(tmp_path: Path) -> None:
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpcio-tools is not installed (it comes with gpuledger[dev])")
    from grpc_tools import protoc

    (tmp_path / "gpuledger" / "node").mkdir(parents=True)
    shutil.copy(SRC / PROTO, tmp_path / PROTO)
    args = [
        "protoc",
        f"-I{tmp_path}",
        f"--python_out={tmp_path}",
        str(tmp_path / PROTO),
    ]
    assert protoc.main(args) == 0
    for generated in ("kubelet_podresources_pb2.py",):
        fresh = (tmp_path / "gpuledger" / "node" / generated).read_text()
        committed = (SRC / "gpuledger" / "node" / generated).read_text()
        assert _normalised(committed) == _normalised(fresh), (
            f"{generated} is stale: regenerate it as kubelet_podresources.proto says"
        )


def test_the_agent_imports_the_committed_modules() -> None:
    assert sys.modules["gpuledger.node.kubelet_podresources_pb2"].__file__ == str(
        SRC / "gpuledger" / "node" / "kubelet_podresources_pb2.py"
    )
