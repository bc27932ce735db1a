"""Collector protocols: the only interfaces through which gpuledger touches hardware.

A collector keeps its own cursors (sample-buffer timestamps, last energy counter, last CPU
times) and each ``read`` returns what happened since the previous ``read``. The recorder merges
these ticks into intervals; it never sees a raw counter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gpuledger.core.model import Event, GpuIdentity, GpuTick, HostTick


class CollectorUnavailable(Exception):
    """The collector cannot run on this machine; ``str(exc)`` says why and what to do."""


@dataclass(frozen=True)
class GpuProcess:
    """One process on one GPU in one read, as the driver reports it (pid: the host's)."""

    uuid: str
    pid: int
    mem_b: int | None  # usedGpuMemory; None when the driver cannot tell (MIG)
    sm_pct: float | None  # mean SM utilisation of its samples in the read; None: no sample


@dataclass
class GpuRead:
    ticks: list[GpuTick] = field(default_factory=list)
    # GPU lost, driver reloaded, NVML errors ... (kind "sampler_error" / "gpu_lost" / "gpu_recovered")
    events: list[Event] = field(default_factory=list)
    # Every process on every GPU (collectors built to see the whole node, e.g. the node agent's)
    processes: list[GpuProcess] = field(default_factory=list)
    # Energy (J) since the previous read of each MIG-mode GPU, by its UUID, for the node agent: NVML
    # reports energy for the physical GPU only, never for its slices (None: not measured this read)
    parent_energy: dict[str, float | None] = field(default_factory=dict)


class GpuCollector(Protocol):
    def devices(self) -> list[GpuIdentity]:
        """The GPUs the wrapped command can see, in the order it sees them."""

    def read(self, pids: set[int], now: float, closes_interval: bool = True, final: bool = False) -> GpuRead:
        """Usage since the previous read (the first read primes cursors and may return no ticks).

        ``pids`` are the run's processes, used for per-process memory and SM utilisation.
        ``closes_interval``: the caller ends an interval with this read. Figures a collector reads
        only where intervals end (NVML's cumulative throttle and energy counters) are read then, so each
        interval gets its own span's; a tick of a read that does not close one has them None
        (``GpuTick``). Callers without intervals leave it True: every read stands alone.
        ``final``: no read follows (the run ends at ``now``), so time a later read would have
        classified (after the newest utilisation sample) is classified in this one.
        Must not raise: errors become events.
        """

    def close(self) -> None: ...


class HostCollector(Protocol):
    def read(self, now: float, closes_interval: bool = False) -> HostTick | None:
        """Usage of the process tree and the host since the previous read (None on the first).

        ``closes_interval``: the recorder ends an interval with this read; every delta in the
        returned tick, host-wide counters included, must then stop at ``now``.
        """

    def pids(self) -> set[int]:
        """The live processes of the run's tree as of the last read."""

    def close(self) -> None: ...
