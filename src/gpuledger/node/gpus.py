"""The node agent's GPU collector: NVML reporting every process on every GPU, or a replayed trace.

Unlike a wrapped run's collector, the agent's sees all the node's GPUs (no CUDA_VISIBLE_DEVICES)
and asks NVML for every process on each (``NvmlCollector(all_processes=True)``). ``--replay-gpus
TRACE`` drives the same collector with the scripted NVML (collect/replay.py's trace format), the
way ``gpuledger run --replay-gpus`` does: a trace's numeric process keys are host pids.
"""

from __future__ import annotations

import time
from typing import Any

from gpuledger.collect.base import CollectorUnavailable, GpuCollector


def _cuda(value: Any) -> int:
    """ "12.4" → 12040, as NVML encodes the CUDA driver version."""
    if isinstance(value, int):
        return value
    major, _, minor = str(value or "12.4").partition(".")
    return int(major) * 1000 + int(minor or 0) * 10


def open_node_gpus(replay_trace: str | None = None, nvml: Any = None) -> tuple[GpuCollector | None, str | None]:
    """(collector, None), or (None, why not); never raises."""
    from gpuledger.collect.nvml import NvmlCollector

    if replay_trace is not None:
        from gpuledger.collect.fake_nvml import FakeNvml
        from gpuledger.collect.replay import load_trace

        try:
            header, gpus = load_trace(replay_trace)
            fake = FakeNvml(gpus, clock=time.time, start=time.time(),
                            driver_version=str(header.get("driver_version", "550.54.15")),
                            cuda_version=_cuda(header.get("cuda_version")))  # fmt: skip
            return NvmlCollector(nvml=fake, source="replay", all_processes=True), None
        except Exception as exc:  # a bad trace is one clear line, never a traceback
            return None, f"replay trace {replay_trace!r} unusable: {exc}"
    try:
        collector = NvmlCollector(nvml=nvml, all_processes=True, wall=time.time if nvml is None else None)
    except CollectorUnavailable as exc:
        return None, str(exc)
    except Exception as exc:
        return None, f"NVML failed: {type(exc).__name__}: {exc}"
    if not collector.devices():
        collector.close()
        return None, "the NVIDIA driver reports no GPU on this machine"
    return collector, None
