"""dcgm-exporter's mapping-file name for a GPU or MIG UUID: ``<gpu index>`` or ``<gpu index>.<GPU instance id>``.

dcgm-exporter's ``--hpc-job-mapping-dir`` names a file by the metric's ``gpu`` label (DCGM's GPU
id, NVML's index) and, for a MIG slice, ``<gpu>.<GPU_I_ID>``, where ``GPU_I_ID`` is the slice's
NVML GPU instance id. Slurm tells the prolog only UUIDs on MIG nodes, so the prolog asks this
module (``gpuledger agent mig-map UUID...``) on the node. From the NVML API reference:
``nvmlDeviceGetHandleByUUID`` takes a GPU or MIG UUID and returns a device or MIG device handle;
``nvmlDeviceGetGpuInstanceId`` gives a MIG device's GPU instance id;
``nvmlDeviceGetDeviceHandleFromMigDeviceHandle`` its parent, whose ``nvmlDeviceGetIndex`` is the index.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

_UUID = re.compile(r"(GPU|MIG)-[0-9A-Fa-f-]+")


class Unresolved(Exception):
    """A name that gets no mapping file; the message says why."""


@dataclass(frozen=True)
class Mapped:
    uuid: str  # as given
    gpu: int  # the (parent) GPU's NVML index
    gpu_instance: int | None = None  # a MIG slice's GPU instance id

    @property
    def file_name(self) -> str:
        return str(self.gpu) if self.gpu_instance is None else f"{self.gpu}.{self.gpu_instance}"


def resolve(nv: Any, uuid: str) -> Mapped:
    """The mapping file of ``uuid`` (a ``GPU-`` or ``MIG-`` UUID); ``nv`` is an initialised pynvml."""
    if not _UUID.fullmatch(uuid):
        raise Unresolved("not a GPU- or MIG- UUID")
    try:
        handle = nv.nvmlDeviceGetHandleByUUID(uuid)
    except (nv.NVMLError_NotFound, nv.NVMLError_InvalidArgument):
        handle = _scan_slices(nv, uuid) if uuid[:4].upper() == "MIG-" else None
        if handle is None:
            raise Unresolved("no such device on this node") from None
    if not nv.nvmlDeviceIsMigDeviceHandle(handle):
        if uuid[:4].upper() == "MIG-":
            raise Unresolved("NVML returned a whole GPU for a MIG UUID")
        return Mapped(uuid, int(nv.nvmlDeviceGetIndex(handle)))
    gi = int(nv.nvmlDeviceGetGpuInstanceId(handle))
    parent = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    return Mapped(uuid, int(nv.nvmlDeviceGetIndex(parent)), gi)


def _scan_slices(nv: Any, uuid: str) -> Any:
    """Drivers whose ``nvmlDeviceGetHandleByUUID`` cannot find MIG UUIDs: look through every GPU's slices."""
    for parent in _gpus(nv):
        try:
            count = nv.nvmlDeviceGetMaxMigDeviceCount(parent)
        except nv.NVMLError:
            continue  # not MIG-capable
        for j in range(count):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, j)
                found = nv.nvmlDeviceGetUUID(mig)
            except nv.NVMLError:
                continue  # MIG indices may have gaps
            if (found.decode() if isinstance(found, bytes) else found).lower() == uuid.lower():
                return mig
    return None


def _gpus(nv: Any) -> Iterator[Any]:
    for i in range(nv.nvmlDeviceGetCount()):
        try:
            yield nv.nvmlDeviceGetHandleByIndex(i)
        except nv.NVMLError:
            continue


def resolve_all(nv: Any, uuids: Sequence[str]) -> tuple[list[Mapped], list[tuple[str, str]]]:
    """(mapped, [(uuid, why not)]): one name failing never costs the others theirs."""
    mapped, failed = [], []
    for uuid in uuids:
        try:
            mapped.append(resolve(nv, uuid))
        except Unresolved as exc:
            failed.append((uuid, str(exc)))
        except nv.NVMLError as exc:
            failed.append((uuid, f"NVML: {exc}"))
    return mapped, failed


def open_nvml(replay_trace: str | None = None) -> Any:
    """An initialised pynvml, or the scripted NVML of a replay trace; raises Unresolved why not."""
    if replay_trace is not None:
        from gpuledger.collect.fake_nvml import FakeNvml
        from gpuledger.collect.replay import load_trace

        try:
            _header, gpus = load_trace(replay_trace)
        except Exception as exc:  # a bad trace is one clear line, never a traceback
            raise Unresolved(f"replay trace {replay_trace!r} unusable: {exc}") from exc
        nv: Any = FakeNvml(gpus, clock=time.time, start=time.time())
    else:
        import pynvml

        nv = pynvml
    try:
        nv.nvmlInit()
    except Exception as exc:
        raise Unresolved(f"NVML failed to start: {exc}") from exc
    return nv
