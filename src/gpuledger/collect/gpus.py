"""Pick the GPU collector for a run: NVML, else a Jetson's sysfs, else nvidia-smi, else none with a plain reason."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpuledger.collect import nvml_lib
from gpuledger.collect.base import CollectorUnavailable, GpuCollector
from gpuledger.collect.jetson import JetsonCollector, no_jetson_gpu_reason

NO_GPU_TAIL = "GPU figures are absent; host metrics were recorded"


def open_gpu_collector(
    env: Mapping[str, str],
    replay_trace: str | None = None,
    *,
    nvml: Any = None,
    which: Callable[[str], str | None] = shutil.which,
    smi_run: Any = None,
    sysfs_root: str = "/",
) -> tuple[GpuCollector | None, str | None]:
    """The collector for the GPUs the command will see, or (None, why not) — never raises.

    ``env`` is the command's environment (CUDA_VISIBLE_DEVICES decides which GPUs are the
    run's). With ``replay_trace`` (a path, or the name of a packaged trace such as
    ``"a100x2-example"``) the NVML collector runs on the trace instead of the hardware and marks
    its devices ``source="replay"``. ``nvml``, ``which`` and ``smi_run`` let tests stand in for
    pynvml, PATH lookup and the nvidia-smi runner; ``sysfs_root`` is where a Jetson's sysfs and
    device tree are looked for (a crafted tree in tests).
    """
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if replay_trace is not None:
        return _replay(replay_trace, visible)
    collector, nvml_reason, lib_missing = _open_nvml(nvml, visible)
    if collector is not None:
        if _tegra_only(collector):
            # JetPack 6's NVML lists the integrated GPU ("Orin (nvgpu)") but answers Not Supported
            # for utilisation, power and memory: sysfs has those figures.
            jetson = _jetson(visible, sysfs_root)
            if jetson is not None:
                collector.close()
                return _non_empty(jetson, visible)
        return _non_empty(collector, visible)
    jetson = _jetson(visible, sysfs_root)  # before nvidia-smi: on a Jetson it reports N/A throughout
    if jetson is not None:
        return _non_empty(jetson, visible)
    jetson_note = no_jetson_gpu_reason(sysfs_root)
    if jetson_note is not None:
        nvml_reason = f"{nvml_reason}; {jetson_note}"
    if which("nvidia-smi") is None:
        if lib_missing and jetson_note is None:
            why = "no NVIDIA driver found (libnvidia-ml.so not loadable and nvidia-smi not on PATH)"
            return None, f"{why}: {NO_GPU_TAIL}"
        return None, f"{nvml_reason}; nvidia-smi not on PATH: {NO_GPU_TAIL}"
    from gpuledger.collect.nvidia_smi import NvidiaSmiCollector

    try:
        smi = NvidiaSmiCollector(visible) if smi_run is None else NvidiaSmiCollector(visible, run=smi_run)
    except Exception as exc:
        return None, f"{nvml_reason}; {exc}: {NO_GPU_TAIL}"
    return _non_empty(smi, visible)


def _open_nvml(nvml: Any, visible: str | None) -> tuple[GpuCollector | None, str, bool]:
    """(the NVML collector, or None with why not and whether the library is missing)."""
    if nvml is None and not nvml_lib.loadable():  # no driver: pynvml and the collector stay unloaded
        return None, nvml_lib.MISSING, True
    from gpuledger.collect.nvml import NvmlCollector, NvmlLibraryMissing

    try:
        # NVML stamps its samples with the host's wall clock (a test's scripted NVML: its own clock)
        return NvmlCollector(nvml=nvml, visible=visible, wall=time.time if nvml is None else None), "", False
    except CollectorUnavailable as exc:
        return None, str(exc), isinstance(exc, NvmlLibraryMissing)
    except Exception as exc:  # monitoring never stops the run
        return None, f"NVML failed: {type(exc).__name__}: {exc}", False


def _jetson(visible: str | None, sysfs_root: str) -> GpuCollector | None:
    try:
        return JetsonCollector(visible, sysfs_root=sysfs_root)
    except Exception:  # not a Jetson (CollectorUnavailable), or a sysfs we cannot make sense of
        return None


def _tegra_only(collector: GpuCollector) -> bool:
    devices = collector.devices()
    return bool(devices) and all("nvgpu" in d.name.lower() for d in devices)


def _non_empty(collector: GpuCollector, visible: str | None) -> tuple[GpuCollector | None, str | None]:
    if collector.devices():
        return collector, None
    collector.close()
    if visible is not None:
        return None, f"CUDA_VISIBLE_DEVICES={visible!r} leaves the command no GPU: {NO_GPU_TAIL}"
    return None, f"the NVIDIA driver reports no GPU on this machine: {NO_GPU_TAIL}"


def _replay(trace: str, visible: str | None) -> tuple[GpuCollector | None, str | None]:
    from gpuledger.collect.replay import open_replay

    try:
        return _non_empty(open_replay(trace, visible), visible)
    except Exception as exc:  # a bad trace file is reported, not raised: the command still runs
        return None, f"replay trace {trace!r} unusable: {exc}: GPU figures are absent"
