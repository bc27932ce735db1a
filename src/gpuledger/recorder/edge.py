"""A run's first edge: the collectors opened and read once, just before ``gpuledger run`` launches CMD.

A run holds its GPUs from the moment CMD is launched until it ends, and that span is what the
summary, the interval export and the bill count as allocated time. So the first interval starts at
a reading taken just before the launch: the GPU's energy counter, its utilisation sample cursor and
violation counters, the host's counters. Were the collectors first read when the recorder starts,
after the launch (opening NVML, reading the git state), that time would lie in no interval: called
idle, and its energy never counted. The last interval ends at the reading taken when CMD has been
reaped (``Recorder.stop``), which classifies every second up to it (docs/METERING.md, "A run's edges").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from gpuledger.core.model import Event

if TYPE_CHECKING:
    from gpuledger.collect.base import GpuCollector
    from gpuledger.collect.host import ProcessTreeCollector


class Primed(NamedTuple):
    """The reading the first interval starts at, for the recorder (recorder/session.py)."""

    t: float  # when it was taken: the run's start
    events: list[Event]  # what the GPU collector reported (notes, errors)
    problems: list[str]  # readings that failed (that collector's first interval starts later)


@dataclass
class Edge:
    """The run's collectors, before the recorder exists; ``read`` takes the first reading."""

    clock: Callable[[], float]
    host: ProcessTreeCollector
    gpu: GpuCollector | None
    gpu_note: str | None
    primed: Primed | None = None
    _closed: bool = field(default=False, repr=False)

    def read(self) -> Primed:
        """Read every collector at one instant (nothing is counted before it); called right
        before the launch, so the run starts there."""
        now = self.clock()
        events: list[Event] = []
        problems: list[str] = []
        # The GPUs first, as at the last reading (Recorder.tick): their energy counters are read at
        # `now` at both ends, whatever a first read of the process tree costs.
        if self.gpu is not None:
            try:
                events = self.gpu.read(set(), now, closes_interval=True).events
            except Exception as exc:
                problems.append(f"GPU sampling failed: {exc!r}")
        try:
            self.host.read(now, closes_interval=True)  # a first read only sets the cursors
        except Exception as exc:
            problems.append(f"host sampling failed: {exc!r}")
        self.primed = Primed(now, events, problems)
        return self.primed

    def close(self) -> None:
        """CMD never started: let the collectors go (the recorder closes them otherwise)."""
        if self._closed:
            return
        self._closed = True
        for collector in (self.gpu, self.host):
            if collector is not None:
                with contextlib.suppress(Exception):
                    collector.close()


def open_edge(
    env: Mapping[str, str],
    clock: Callable[[], float],
    *,
    interval_s: float,
    no_gpu: bool = False,
    replay_trace: str | None = None,
) -> Edge:
    """The collectors of a ``gpuledger run``: the GPUs CMD will see (``env``: its environment) and
    the process tree below this process (CMD and what it starts; the output relay, started with
    CMD, is left out with ``host.exclude`` once it runs)."""
    from gpuledger.collect.gpus import open_gpu_collector
    from gpuledger.collect.host import ProcessTreeCollector
    from gpuledger.recorder.recorder import ticks_per_interval

    if no_gpu:
        gpu, note = None, "GPU metering was turned off (--no-gpu)"
    else:
        gpu, note = open_gpu_collector(env, replay_trace=replay_trace)
    try:
        host = ProcessTreeCollector(os.getpid(), include_root=False, system_every=ticks_per_interval(interval_s))
    except Exception:
        if gpu is not None:
            with contextlib.suppress(Exception):
                gpu.close()
        raise
    return Edge(clock, host, gpu, note)
