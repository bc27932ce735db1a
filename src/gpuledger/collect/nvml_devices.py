"""GPU discovery for the NVML collector: which devices a run sees, and what they are.

``DeviceFinder(nvml, absent, source).discover(visible)`` lists the GPUs NVML knows with their MIG
mode and slices, resolves ``visible`` (CUDA_VISIBLE_DEVICES, see visible.py) against them, and
returns, per visible device in CUDA's order, a ``Found``: its ``GpuIdentity``, the NVML handle to
read it through (a whole GPU, or a MIG slice whose identity names its parent GPU and profile), the
minor number of the GPU's device node (/dev/nvidia<minor>) and whether CMD named the slice through
its parent. A query
whose absence is fine here (driver and CUDA versions, PCI bus, power limit, memory size, MIG
profile attributes) leaves its field None. ``mig_slices`` is also how the collector finds a slice
again when a lost GPU answers and the driver cannot look its MIG UUID up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gpuledger.collect.nvml_query import LOST_ERRORS
from gpuledger.collect.visible import Candidate, resolve_visible
from gpuledger.core.model import GpuIdentity

# (handle, uuid, MIG mode text, MIG slices as (uuid, handle) or None when MIG is off)
_Gpu = tuple[Any, str, "str | None", "list[tuple[str, Any]] | None"]


@dataclass(frozen=True)
class Found:
    ident: GpuIdentity
    handle: Any
    minor: int | None  # /dev/nvidia<minor> of the (parent) GPU
    via_parent: bool = False  # a MIG slice CMD named by its parent GPU


class DeviceFinder:
    """Discovery-time NVML queries; ``absent`` are the errors that mean "not supported here"."""

    def __init__(self, nvml: Any, absent: tuple[type[BaseException], ...], source: str) -> None:
        self._nvml = nvml
        self._absent = absent
        self._not_found = nvml.NVMLError_NotFound
        self._lost = tuple(getattr(nvml, n) for n in LOST_ERRORS if hasattr(nvml, n))
        self._source = source
        self._f_mem = getattr(nvml, "nvmlDeviceGetMemoryInfo", None)
        self._mem_v2 = getattr(nvml, "nvmlMemory_v2", None)

    def discover(self, visible: str | None) -> list[Found]:
        """Each device ``visible`` exposes, in CUDA's order."""
        nv = self._nvml
        driver = self._opt(getattr(nv, "nvmlSystemGetDriverVersion", None))
        common = {
            "driver_version": None if driver is None else _text(driver),
            "cuda_version": _cuda_version(self._opt(getattr(nv, "nvmlSystemGetCudaDriverVersion", None))),
            "source": self._source,
        }
        get_mode = getattr(nv, "nvmlDeviceGetMigMode", None)
        gpus: list[_Gpu] = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            mode = self._opt(get_mode, h)
            enabled = bool(mode) and mode[0] == nv.NVML_DEVICE_MIG_ENABLE
            mode_text = None if mode is None else "enabled" if enabled else "disabled"
            gpus.append((h, _text(nv.nvmlDeviceGetUUID(h)), mode_text, self.mig_slices(h) if enabled else None))
        cands = [
            Candidate(u, None if s is None else tuple(m for m, _ in s), () if s is None else self._mig_ids(s))
            for _, u, _, s in gpus
        ]
        out = []
        for index, v in enumerate(resolve_visible(visible, cands)):
            gpu = gpus[v.nvml_index]
            ident, handle = self._device(index, v.nvml_index, v.mig_index, gpu, common)
            minor = self._opt(getattr(nv, "nvmlDeviceGetMinorNumber", None), gpu[0])
            out.append(Found(ident, handle, None if minor is None else int(minor), v.via_parent))
        return out

    def _mig_ids(self, slices: list[tuple[str, Any]]) -> tuple[tuple[int, int] | None, ...]:
        """(GPU instance id, compute instance id) of each slice, for the R450 ``MIG-GPU-<uuid>/<gi>/<ci>`` form."""
        gi_fn = getattr(self._nvml, "nvmlDeviceGetGpuInstanceId", None)
        ci_fn = getattr(self._nvml, "nvmlDeviceGetComputeInstanceId", None)
        out: list[tuple[int, int] | None] = []
        for _, mh in slices:
            gi, ci = self._opt(gi_fn, mh), self._opt(ci_fn, mh)
            out.append(None if gi is None or ci is None else (int(gi), int(ci)))
        return tuple(out)

    def mig_slices(self, h: Any) -> list[tuple[str, Any]]:
        """(uuid, handle) of the MIG slices of the GPU ``h``."""
        nv = self._nvml
        out = []
        for j in range(self._opt(getattr(nv, "nvmlDeviceGetMaxMigDeviceCount", None), h) or 0):
            mh = self._opt(getattr(nv, "nvmlDeviceGetMigDeviceHandleByIndex", None), h, j)
            if mh is not None:  # MIG indices may have gaps
                out.append((_text(nv.nvmlDeviceGetUUID(mh)), mh))
        return out

    def _opt(self, fn: Any, *args: Any) -> Any:
        """A discovery-time query whose absence is fine; so is its failure (one field, not the GPU)."""
        if fn is None:
            return None
        try:
            return fn(*args)
        except self._lost:
            raise
        except self._nvml.NVMLError:
            return None

    def _device(
        self, index: int, nvml_index: int, mig_index: int | None, gpu: _Gpu, common: dict[str, Any]
    ) -> tuple[GpuIdentity, Any]:
        nv = self._nvml
        h, uuid, mode_text, slices = gpu
        pci = self._opt(getattr(nv, "nvmlDeviceGetPciInfo", None), h)
        pci_bus_id = None if pci is None else _text(pci.busId)
        if mig_index is None or slices is None:
            limit = self._opt(getattr(nv, "nvmlDeviceGetEnforcedPowerLimit", None), h)
            ident = GpuIdentity(
                index=index, uuid=uuid, name=_text(nv.nvmlDeviceGetName(h)), pci_bus_id=pci_bus_id,
                memory_total_b=self._memory_total(h), power_limit_w=None if limit is None else limit / 1000,
                mig_mode=mode_text, nvml_index=nvml_index, **common,
            )  # fmt: skip
            return ident, h
        mig_uuid, mh = slices[mig_index]
        name = _text(nv.nvmlDeviceGetName(mh))
        ident = GpuIdentity(
            index=index, uuid=mig_uuid, name=name, pci_bus_id=pci_bus_id, memory_total_b=self._memory_total(mh),
            mig_mode=mode_text, mig_parent_uuid=uuid, mig_profile=self._mig_profile(name, mh),
            nvml_index=nvml_index, **common,
        )  # fmt: skip
        return ident, mh

    def _memory_total(self, h: Any) -> int | None:
        m = self._opt(self._f_mem, h, self._mem_v2) if self._mem_v2 else None
        m = m if m is not None else self._opt(self._f_mem, h)
        return None if m is None else int(m.total)

    def _mig_profile(self, name: str, mh: Any) -> str | None:
        if " MIG " in name:  # NVML names slices "<parent name> MIG 1g.10gb"
            return name.rsplit(" MIG ", 1)[1].strip()
        attrs = self._opt(getattr(self._nvml, "nvmlDeviceGetAttributes", None), mh)
        if attrs is None:
            return None
        return f"{attrs.gpuInstanceSliceCount}g.{math.ceil(attrs.memorySizeMB / 1024)}gb"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value) if value is not None else ""


def _cuda_version(v: int | None) -> str | None:
    """NVML's 12040 -> "12.4"."""
    return None if not v else f"{v // 1000}.{v % 1000 // 10}"
