"""Which GPUs the wrapped command can see: CUDA_VISIBLE_DEVICES, resolved the way CUDA does.

Only these GPUs are the run's; the others on the machine belong to someone else.

Order. NVML (and nvidia-smi) number GPUs in PCI bus order. CUDA numbers them FASTEST_FIRST
unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``. We assume PCI bus order — what nvidia-smi shows, and
the same as FASTEST_FIRST on the usual machine of identical GPUs. On a machine mixing GPU models
without ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, an index in CUDA_VISIBLE_DEVICES may name a different
GPU for CUDA than for us; UUIDs are unambiguous.

Rules (CUDA's, as documented by NVIDIA):

* unset: every GPU; a GPU in MIG mode contributes its MIG slices instead of itself (CUDA cannot
  run work on a MIG-enabled parent). CUDA 11/12 let one process use only one MIG slice, so on a
  MIG machine without CUDA_VISIBLE_DEVICES this over-approximates: set it to be exact.
* ``""``, ``"-1"`` and ``"NoDevFiles"`` (set by some schedulers): no GPU.
* entries, comma separated, whitespace ignored: an index (``"0,2"``), a GPU UUID
  (``"GPU-8f2a..."``) or a MIG slice UUID (``"MIG-..."``); a UUID may be shortened to any prefix
  that names exactly one device. Case is ignored.
* a GPU in MIG mode named by its index or ``GPU-`` UUID cannot run work itself: CUDA runs on
  its MIG devices, and one process enumerates only one MIG device (MIG user guide, "CUDA device
  enumeration"), so the entry resolves to the GPU's first slice, marked ``via_parent`` so the
  collector can say so. A GPU in MIG mode without slices is an invalid entry.
* the older ``MIG-GPU-<uuid>/<gi>/<ci>`` form (drivers R450/R460) names a slice by its parent's
  UUID and its GPU- and compute-instance ids.
* CUDA stops at the first invalid entry: an index out of range, a UUID that matches no device
  or more than one, a device listed twice, anything else. The entries before it stay visible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

_NONE_VALUES = ("", "-1", "nodevfiles")


@dataclass(frozen=True)
class Candidate:
    """One physical GPU as NVML lists it (the list is in NVML index order)."""

    uuid: str  # "GPU-..."
    mig_uuids: tuple[str, ...] | None = None  # None: not in MIG mode; () MIG mode without slices
    mig_ids: tuple[tuple[int, int] | None, ...] = ()  # (GPU instance id, compute instance id) per slice


@dataclass(frozen=True)
class VisibleDevice:
    """One device the command sees; its CUDA index is its position in the resolved list."""

    nvml_index: int  # the physical GPU's NVML index
    uuid: str  # "GPU-..." or "MIG-..."
    mig_index: int | None = None  # position of the slice on its parent, for MIG slices
    via_parent: bool = False  # named by its parent GPU (index or GPU- UUID) in MIG mode


def resolve_visible(cuda_visible_devices: str | None, all_devices: Sequence[Candidate | str]) -> list[VisibleDevice]:
    """The devices CMD sees, in the order it sees them (see the module docstring for rules)."""
    gpus = [c if isinstance(c, Candidate) else Candidate(c) for c in all_devices]
    if cuda_visible_devices is None:
        return _everything(gpus)
    value = cuda_visible_devices.strip()
    if value.lower() in _NONE_VALUES:
        return []
    seen: set[str] = set()
    out: list[VisibleDevice] = []
    for token in value.split(","):
        dev = _resolve_token(token.strip(), gpus)
        if dev is None or dev.uuid in seen:
            break  # CUDA ignores everything from the first invalid entry on
        seen.add(dev.uuid)
        out.append(dev)
    return out


def _everything(gpus: list[Candidate]) -> list[VisibleDevice]:
    out: list[VisibleDevice] = []
    for i, gpu in enumerate(gpus):
        if gpu.mig_uuids is None:
            out.append(VisibleDevice(i, gpu.uuid))
        else:
            out.extend(VisibleDevice(i, m, j) for j, m in enumerate(gpu.mig_uuids))
    return out


def _resolve_token(token: str, gpus: list[Candidate]) -> VisibleDevice | None:
    low = token.lower()
    if low.startswith("gpu-"):
        hits = [i for i, g in enumerate(gpus) if g.uuid.lower().startswith(low)]
        return _whole_gpu(hits[0], gpus) if len(hits) == 1 else None
    if low.startswith("mig-gpu-"):
        return _legacy_mig(low, gpus)
    if low.startswith("mig-"):
        hits = [
            VisibleDevice(i, m, j)
            for i, g in enumerate(gpus)
            for j, m in enumerate(g.mig_uuids or ())
            if m.lower().startswith(low)
        ]
        return hits[0] if len(hits) == 1 else None
    if token.isascii() and token.isdigit():  # no sign: "-1" and "+1" are not indices here
        i = int(token)
        return _whole_gpu(i, gpus) if i < len(gpus) else None
    return None


def _whole_gpu(i: int, gpus: list[Candidate]) -> VisibleDevice | None:
    gpu = gpus[i]
    if gpu.mig_uuids is None:
        return VisibleDevice(i, gpu.uuid)
    if not gpu.mig_uuids:
        return None  # MIG mode, no slice: CUDA has no device here
    return VisibleDevice(i, gpu.mig_uuids[0], 0, via_parent=True)


def _legacy_mig(low: str, gpus: list[Candidate]) -> VisibleDevice | None:
    """``MIG-GPU-<parent uuid>/<gi>/<ci>`` (drivers R450/R460)."""
    parts = low[len("mig-") :].split("/")
    if len(parts) != 3 or not (parts[1].isdigit() and parts[2].isdigit()):
        return None
    parent, ids = parts[0], (int(parts[1]), int(parts[2]))
    hits = [i for i, g in enumerate(gpus) if g.uuid.lower() == parent]
    if len(hits) != 1:
        return None
    gpu = gpus[hits[0]]
    for j, slice_ids in enumerate(gpu.mig_ids):
        if slice_ids == ids and gpu.mig_uuids is not None and j < len(gpu.mig_uuids):
            return VisibleDevice(hits[0], gpu.mig_uuids[j], j)
    return None
