"""`gpuledger agent mig-map`: GPU and MIG UUIDs to dcgm-exporter's mapping-file names, through NVML.

The scripted NVML (collect/fake_nvml*.py) answers the calls the resolver makes as the NVML API
reference documents them: ``nvmlDeviceGetHandleByUUID`` takes a GPU or a MIG UUID,
``nvmlDeviceGetGpuInstanceId`` gives a MIG device's GPU instance id,
``nvmlDeviceGetDeviceHandleFromMigDeviceHandle`` its parent GPU.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.collect.fake_nvml import FakeGpu, FakeNvml
from gpuledger.node.mig_map import Mapped, Unresolved, resolve, resolve_all
from test_node_slurm_dcgm_map import SLICE_A, SLICE_B, write_mig_trace


def node(gpus: list[FakeGpu], cls: type[FakeNvml] = FakeNvml) -> FakeNvml:
    nv = cls(gpus, clock=lambda: 0.0)
    nv.nvmlInit()
    return nv


def a100(uuid: str, slices: list[tuple[str, int]] = ()) -> FakeGpu:  # type: ignore[assignment]
    return FakeGpu(uuid=uuid, name="NVIDIA A100-SXM4-80GB",
                   mig=[FakeGpu(uuid=u, mig_profile="1g.10gb", gpu_instance_id=gi) for u, gi in slices])  # fmt: skip


def test_a_slice_is_its_gpus_index_dot_its_gpu_instance_id_not_its_position() -> None:
    nv = node([a100("GPU-0000"), a100("GPU-1111", [("MIG-aaaa", 13), ("MIG-bbbb", 9)])])
    assert resolve(nv, "MIG-bbbb") == Mapped("MIG-bbbb", 1, 9)
    assert resolve(nv, "MIG-bbbb").file_name == "1.9"
    assert resolve(nv, "GPU-0000").file_name == "0"  # a whole GPU: its index alone
    assert resolve(nv, "GPU-1111").file_name == "1"  # a GPU in MIG mode named whole: likewise


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 14), max_size=4, unique=True), min_size=1, max_size=4))
def test_every_slice_of_any_node_maps_to_its_parent_and_instance(layout: list[list[int]]) -> None:
    gpus = [a100(f"GPU-{i:04x}", [(f"MIG-{i:02x}{gi:02x}", gi) for gi in gis]) for i, gis in enumerate(layout)]
    nv = node(gpus)
    mig_uuids = [(f"MIG-{i:02x}{gi:02x}", f"{i}.{gi}") for i, gis in enumerate(layout) for gi in gis]
    mapped, failed = resolve_all(nv, [u for u, _ in mig_uuids])
    assert failed == [] and [(m.uuid, m.file_name) for m in mapped] == mig_uuids


def test_what_cannot_be_resolved_says_why_and_costs_the_others_nothing() -> None:
    nv = node([a100("GPU-0000", [("MIG-aaaa", 1)])])
    mapped, failed = resolve_all(nv, ["MIG-dead", "../../x", "MIG-aaaa", "MIG-GPU-0000/1/0"])
    assert [m.file_name for m in mapped] == ["0.1"]
    assert failed == [("MIG-dead", "no such device on this node"), ("../../x", "not a GPU- or MIG- UUID"),
                      ("MIG-GPU-0000/1/0", "not a GPU- or MIG- UUID")]  # fmt: skip
    with pytest.raises(Unresolved, match="no such device"):
        resolve(nv, "GPU-ffff")


class _NoMigByUuid(FakeNvml):
    """A driver whose nvmlDeviceGetHandleByUUID finds GPUs only (the collector copes with those too)."""

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes):  # type: ignore[no-untyped-def]
        if str(uuid).upper().startswith("MIG-"):
            raise pynvml.NVMLError_NotFound()
        return super().nvmlDeviceGetHandleByUUID(uuid)


def test_a_driver_that_cannot_find_mig_uuids_is_answered_from_the_gpus_slices() -> None:
    nv = node([a100("GPU-0000"), a100("GPU-1111", [("MIG-aaaa", 2), ("MIG-bbbb", 4)])], _NoMigByUuid)
    assert resolve(nv, "MIG-bbbb").file_name == "1.4"
    with pytest.raises(Unresolved, match="no such device"):
        resolve(nv, "MIG-cccc")


def test_an_nvml_error_on_one_slice_is_that_slices_reason() -> None:
    gpu = a100("GPU-0000", [("MIG-aaaa", 1)])
    gpu.mig[0].errors["nvmlDeviceGetGpuInstanceId"] = pynvml.NVML_ERROR_NO_PERMISSION
    nv = node([gpu, a100("GPU-1111")])
    mapped, failed = resolve_all(nv, ["MIG-aaaa", "GPU-1111"])
    assert [m.file_name for m in mapped] == ["1"] and failed[0][0] == "MIG-aaaa" and "NVML" in failed[0][1]


def test_the_command_prints_uuid_and_file_name_and_exits_1_for_what_it_cannot_resolve(tmp_path: Path) -> None:
    trace = write_mig_trace(tmp_path / "node.jsonl")
    done = subprocess.run([sys.executable, "-m", "gpuledger", "agent", "mig-map", "--replay-gpus", str(trace), "--",
                           SLICE_B, SLICE_A, "GPU-11111111-2222-3333-4444-555555555555", "MIG-0000dead"],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 1
    assert done.stdout == f"{SLICE_B} 1.5\n{SLICE_A} 1.3\nGPU-11111111-2222-3333-4444-555555555555 0\n"
    assert done.stderr == "gpuledger agent mig-map: MIG-0000dead: no such device on this node\n"


def test_the_command_without_nvml_says_so_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    done = subprocess.run([sys.executable, "-m", "gpuledger", "agent", "mig-map", "--replay-gpus", str(bad), SLICE_A],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("gpuledger agent mig-map: replay trace") and done.stderr.count("\n") == 1
