"""CUDA_VISIBLE_DEVICES resolution, CUDA's rules."""

from __future__ import annotations

import pytest

from gpuledger.collect.visible import Candidate, VisibleDevice, resolve_visible

G0 = "GPU-11111111-aaaa-4bbb-8ccc-000000000000"
G1 = "GPU-22222222-aaaa-4bbb-8ccc-000000000001"
G2 = "GPU-22223333-aaaa-4bbb-8ccc-000000000002"
M0 = "MIG-9a0b1c2d-0000-5000-8000-00000000000a"
M1 = "MIG-9a0b1c2d-1111-5000-8000-00000000000b"
GPUS = [G0, G1, G2]


def uuids(value: str | None, gpus=GPUS) -> list[str]:
    return [d.uuid for d in resolve_visible(value, gpus)]


def test_unset_means_every_gpu_in_nvml_order() -> None:
    assert uuids(None) == GPUS
    assert resolve_visible(None, GPUS)[2] == VisibleDevice(2, G2)


@pytest.mark.parametrize("value", ["", "  ", "-1", "NoDevFiles", "nodevfiles"])
def test_values_that_hide_every_gpu(value: str) -> None:
    assert uuids(value) == []


def test_indices_in_the_order_given() -> None:
    assert uuids("0,2") == [G0, G2]
    assert uuids(" 2 , 0 ") == [G2, G0]
    assert [d.nvml_index for d in resolve_visible("2,0", GPUS)] == [2, 0]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0,5,1", [G0]),  # out of range stops the list
        ("1,abc,0", [G1]),  # garbage stops it
        ("1,-1,0", [G1]),
        ("0,0,1", [G0]),  # a device twice is invalid
        ("0,,1", [G0]),
        ("7", []),
    ],
)
def test_cuda_stops_at_the_first_invalid_entry(value: str, expected: list[str]) -> None:
    assert uuids(value) == expected


def test_uuids_full_prefix_and_case() -> None:
    assert uuids(f"{G2},{G0}") == [G2, G0]
    assert uuids("GPU-1111") == [G0]
    assert uuids("gpu-22223") == [G2]
    assert uuids("GPU-2222,GPU-1111") == []  # ambiguous prefix: invalid, stops at once
    assert uuids("GPU-1111,GPU-2222") == [G0]
    assert uuids("GPU-ffff") == []


def test_mig_slices() -> None:
    gpus = [Candidate(G0, (M0, M1)), Candidate(G1)]
    assert resolve_visible(M1, gpus) == [VisibleDevice(0, M1, 1)]
    assert resolve_visible("MIG-9a0b1c2d-0", gpus) == [VisibleDevice(0, M0, 0)]
    assert resolve_visible("MIG-9a0b", gpus) == []  # ambiguous
    # unset: a MIG-mode GPU contributes its slices, not itself
    assert [d.uuid for d in resolve_visible(None, gpus)] == [M0, M1, G1]
    assert [d.uuid for d in resolve_visible(None, [Candidate(G0, ()), Candidate(G1)])] == [G1]


def test_a_mig_mode_gpu_named_by_index_or_uuid_runs_on_its_first_slice() -> None:
    # CUDA cannot run work on the parent; one process enumerates one MIG device: its first slice
    gpus = [Candidate(G0, (M0, M1)), Candidate(G1)]
    assert resolve_visible("0", gpus) == [VisibleDevice(0, M0, 0, via_parent=True)]
    assert resolve_visible(f"{G0[:12]},1", gpus) == [VisibleDevice(0, M0, 0, via_parent=True), VisibleDevice(1, G1)]
    assert resolve_visible("0,1", [Candidate(G0, ()), Candidate(G1)]) == []  # MIG mode, no slice: invalid entry


def test_the_r450_mig_form_names_a_slice_by_parent_and_instance_ids() -> None:
    gpus = [Candidate(G0, (M0, M1), ((1, 0), (2, 0))), Candidate(G1)]
    assert resolve_visible(f"MIG-{G0}/2/0", gpus) == [VisibleDevice(0, M1, 1)]
    assert resolve_visible(f"mig-{G0.lower()}/1/0,1", gpus) == [VisibleDevice(0, M0, 0), VisibleDevice(1, G1)]
    assert resolve_visible(f"1,MIG-{G0}/3/0", gpus) == [VisibleDevice(1, G1)]  # no such slice: the list stops
    assert resolve_visible(f"MIG-{G0}/x/0", gpus) == []
