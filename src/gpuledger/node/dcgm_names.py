"""The node agent's figures under NVIDIA dcgm-exporter's metric names, units and labels.

Followed release: dcgm-exporter 4.8 (4.6.1-4.8.4, the last before 4.9 renamed the default fields to
DCGM 4.7's names and units). Its default collectors (``etc/default-counters.csv``) give the names
and units; its exposition gives the labels, in its order: ``gpu`` (the GPU's index), ``UUID`` (the
physical GPU's), ``pci_bus_id``, ``device`` (``nvidia<index>``), ``modelName``, on a MIG slice
``GPU_I_PROFILE`` and ``GPU_I_ID``, ``hostname`` (``Hostname`` before 4.6.0-4.8.3, dcgm-exporter
pull request #655), ``DCGM_FI_DRIVER_VERSION``, then ``container``, ``namespace``, ``pod`` and, on a
Slurm job's GPU, ``hpc_job`` (what ``--hpc-job-mapping-dir`` adds). A label whose value is unknown
is left out, as dcgm-exporter leaves out the MIG labels of a whole GPU.

``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` is the device's own counter, in mJ since the driver was
loaded (NVML's ``nvmlDeviceGetTotalEnergyConsumption``, which DCGM reads), typed ``counter`` under
that exact name as dcgm-exporter types it; a GPU without the counter (or a MIG slice: the counter is
the whole GPU's) has no such series rather than an estimate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client.core import Metric

from gpuledger.core.model import GpuIdentity, GpuTick

if TYPE_CHECKING:
    from gpuledger.node.metrics import OwnerLabels

RELEASE = "4.8"
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
UNSUFFIXED_COUNTERS = (ENERGY,)  # counters dcgm-exporter names without OpenMetrics' _total
MIB = 2**20

_FAMILIES = (
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    (ENERGY, "counter", "Total energy consumption since boot (in mJ)."),
)


def model_name(ident: GpuIdentity) -> str:
    """The physical GPU's name: NVML names a slice ``<GPU name> MIG <profile>``."""
    return ident.name.rsplit(" MIG ", 1)[0] if ident.mig_parent_uuid else ident.name


def dcgm_labels(
    ident: GpuIdentity, owner: OwnerLabels, hostname: str, gpu_instance_id: int | None = None
) -> dict[str, str]:
    """One series' labels, in dcgm-exporter's order (the module docstring)."""
    index = ident.nvml_index if ident.nvml_index is not None else ident.index
    labels = {"gpu": str(index), "UUID": ident.mig_parent_uuid or ident.uuid}
    if ident.pci_bus_id:
        labels["pci_bus_id"] = ident.pci_bus_id
    labels["device"] = f"nvidia{index}"
    labels["modelName"] = model_name(ident)
    if ident.mig_parent_uuid:
        if ident.mig_profile:
            labels["GPU_I_PROFILE"] = ident.mig_profile
        if gpu_instance_id is not None:
            labels["GPU_I_ID"] = str(gpu_instance_id)
    labels["hostname"] = hostname
    if ident.driver_version:
        labels["DCGM_FI_DRIVER_VERSION"] = ident.driver_version
    labels.update(container=owner.container, namespace=owner.namespace, pod=owner.pod)
    if owner.slurm_job:
        labels["hpc_job"] = owner.slurm_job
    return labels


class DcgmFamilies:
    """The five families of one /metrics answer, filled series by series."""

    def __init__(self) -> None:
        self._fams = {name: Metric(name, doc, kind) for name, kind, doc in _FAMILIES}

    def add(
        self,
        ident: GpuIdentity,
        t: GpuTick | None,
        owner: OwnerLabels,
        hostname: str,
        energy_total_mj: int | None,
        gpu_instance_id: int | None,
    ) -> None:
        labels = dcgm_labels(ident, owner, hostname, gpu_instance_id)
        values: list[tuple[str, float | None]] = [(ENERGY, None if ident.mig_parent_uuid else energy_total_mj)]
        if t is not None:
            span = t.t1 - t.t0
            util = None if t.busy_s is None or span <= 0 else min(100.0, 100.0 * t.busy_s / span)
            values += [
                ("DCGM_FI_DEV_GPU_UTIL", util),
                ("DCGM_FI_DEV_FB_USED", None if t.mem_used_b is None else t.mem_used_b / MIB),
                ("DCGM_FI_DEV_POWER_USAGE", t.power_w),
                ("DCGM_FI_DEV_GPU_TEMP", t.temp_c),
            ]
        for name, value in values:
            if value is not None:
                self._fams[name].add_sample(name, labels, float(value))

    def families(self) -> list[Metric]:
        return [self._fams[name] for name, _, _ in _FAMILIES]
