"""The agent's own ``/metrics``: every GPU of the node with the owners of its processes as labels.

Series are per GPU and owner: the GPU's figures (busy time, energy, power, memory, temperature)
carry the owner labels of each run whose processes are on it (``run_id``, ``team``, ``project``,
``user``, ``container``, ``pod``, ``namespace``, ``slurm_job``), one series per owner, so a GPU
shared by two runs shows its figures under both (the cost report splits them; these are the
device's). A GPU with no process has one series with empty owner labels. Counters accumulate the
device's busy seconds and joules over the ticks during which the owner was on the GPU. An owner's
series are kept ``KEEP_ENDED_S`` after it left the GPU, then dropped (bounded cardinality).

With ``dcgm_names`` the same figures are also exposed under dcgm-exporter's names and labels
(``node/dcgm_names.py``: its 4.8 release's, ``hostname`` in lower case) so dashboards written for
it keep working; docs/AGENT.md lists them with their sources.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuledger.core.model import GpuIdentity, GpuTick
from gpuledger.node.dcgm_names import DcgmFamilies
from gpuledger.prom import names as n

OWNER_LABELS = ("run_id", "team", "project", "user", "container", "pod", "namespace", "slurm_job")
GPU_LABELS = ("gpu", "uuid", *OWNER_LABELS)
KEEP_ENDED_S = 600.0

PROC_MEMORY = ("gpuledger_gpu_process_memory_bytes", "GPU memory held by the owner's processes, bytes.")
UNALLOCATED = ("gpuledger_gpu_unallocated_use", "Processes seen using a GPU their owner was not allocated.")
UNATTRIBUTED = ("gpuledger_agent_unattributed_processes", "GPU processes the agent could not look up in /proc.")
SOURCE_UP = ("gpuledger_agent_source_up", "1 when a platform adapter answers and sees its platform, else 0.")
OPEN_RUNS = ("gpuledger_agent_discovered_runs", "Discovered runs the agent is recording now.")


@dataclass(frozen=True)
class OwnerLabels:
    run_id: str = ""
    team: str = ""
    project: str = ""
    user: str = ""
    container: str = ""
    pod: str = ""
    namespace: str = ""
    slurm_job: str = ""

    def values(self) -> list[str]:
        return [getattr(self, k) for k in OWNER_LABELS]


@dataclass
class _Series:
    busy_s: float = 0.0
    energy_j: float = 0.0
    busy_seen: bool = False
    energy_seen: bool = False
    proc_mem_b: int | None = None
    unallocated: int = 0
    seen_at: float = 0.0


@dataclass
class _Gpu:
    ident: GpuIdentity
    tick: GpuTick | None = None
    series: dict[OwnerLabels, _Series] = field(default_factory=dict)
    current: set[OwnerLabels] = field(default_factory=set)
    unattributed: int = 0
    energy_total_mj: int | None = None  # the device's own counter as last read (mJ since the driver loaded)
    gpu_instance_id: int | None = None  # a MIG slice's GPU instance id


class NodeMetrics:
    """Fed by the agent's loop (``observe``), read by the HTTP server's threads (``collect``)."""

    def __init__(self, hostname: str, *, dcgm_names: bool = False, clock: Callable[[], float] = time.time) -> None:
        self._hostname = hostname
        self._dcgm = dcgm_names
        self._clock = clock
        self._lock = threading.Lock()
        self._gpus: dict[str, _Gpu] = {}
        self._sources: dict[str, bool] = {}
        self._open_runs = 0

    # -- the loop's side ----------------------------------------------------------------------
    def observe(
        self,
        ident: GpuIdentity,
        tick: GpuTick | None,
        owners: Sequence[tuple[OwnerLabels, int | None]],
        unattributed: int = 0,
    ) -> None:
        """One GPU's reading: its tick (None when there was none) and its owners with their memory."""
        now = self._clock()
        with self._lock:
            g = self._gpus.get(ident.uuid) or self._gpus.setdefault(ident.uuid, _Gpu(ident))
            g.ident = ident
            if tick is not None:
                g.tick = tick
                if tick.energy_total_mj is not None:  # read where an interval ends: the latest stands
                    g.energy_total_mj = tick.energy_total_mj
                if tick.gpu_instance_id is not None:
                    g.gpu_instance_id = tick.gpu_instance_id
            g.unattributed = unattributed
            present = [(o, m) for o, m in owners] or [(OwnerLabels(), None)]
            g.current = {o for o, _ in present}
            for owner, mem in present:
                s = g.series.get(owner) or g.series.setdefault(owner, _Series())
                s.seen_at, s.proc_mem_b = now, mem
                if tick is not None and tick.busy_s is not None:
                    s.busy_s, s.busy_seen = s.busy_s + tick.busy_s, True
                if tick is not None and tick.energy_j is not None:
                    s.energy_j, s.energy_seen = s.energy_j + tick.energy_j, True
            for owner in [o for o, s in g.series.items() if now - s.seen_at > KEEP_ENDED_S]:
                del g.series[owner]

    def unallocated_use(self, uuid: str, owner: OwnerLabels) -> None:
        with self._lock:
            g = self._gpus.get(uuid)
            if g is not None:
                s = g.series.get(owner) or g.series.setdefault(owner, _Series(seen_at=self._clock()))
                s.unallocated += 1

    def set_sources(self, up: dict[str, bool], open_runs: int) -> None:
        with self._lock:
            self._sources, self._open_runs = dict(up), open_runs

    # -- prometheus_client's collector protocol -----------------------------------------------
    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            gpus = sorted(self._gpus.values(), key=lambda g: (g.ident.index, g.ident.uuid))
            fams = self._families(gpus)
            sources, open_runs = dict(self._sources), self._open_runs
        yield from fams
        up = GaugeMetricFamily(SOURCE_UP[0], SOURCE_UP[1], labels=("source",))
        for name, ok in sorted(sources.items()):
            up.add_metric([name], 1.0 if ok else 0.0)
        yield up
        yield GaugeMetricFamily(OPEN_RUNS[0], OPEN_RUNS[1], value=float(open_runs))

    def _families(self, gpus: list[_Gpu]) -> list[Metric]:
        busy = CounterMetricFamily(n.GPU_BUSY.family, n.GPU_BUSY.help, labels=GPU_LABELS)
        energy = CounterMetricFamily(n.GPU_ENERGY.family, n.GPU_ENERGY.help, labels=GPU_LABELS)
        unalloc = CounterMetricFamily(UNALLOCATED[0], UNALLOCATED[1], labels=GPU_LABELS)
        gauges = {m.name: GaugeMetricFamily(m.name, m.help, labels=GPU_LABELS)
                  for m in (n.GPU_POWER, n.GPU_MEMORY, n.GPU_MEMORY_TOTAL, n.GPU_TEMPERATURE)}  # fmt: skip
        proc_mem = GaugeMetricFamily(PROC_MEMORY[0], PROC_MEMORY[1], labels=GPU_LABELS)
        unattributed = GaugeMetricFamily(UNATTRIBUTED[0], UNATTRIBUTED[1], labels=("gpu", "uuid"))
        dcgm = DcgmFamilies() if self._dcgm else None
        for g in gpus:
            gpu = [str(g.ident.index), g.ident.uuid]
            unattributed.add_metric(gpu, float(g.unattributed))
            t = g.tick
            for owner, s in sorted(g.series.items(), key=lambda kv: kv[0].values()):
                labels = gpu + owner.values()
                if s.busy_seen:
                    busy.add_metric(labels, s.busy_s)
                if s.energy_seen:
                    energy.add_metric(labels, s.energy_j)
                if s.unallocated:
                    unalloc.add_metric(labels, float(s.unallocated))
                if owner not in g.current:
                    continue  # an owner that left: its counters stay a while, its gauges do not
                for m, value in ((n.GPU_POWER, t.power_w if t else None), (n.GPU_MEMORY, t.mem_used_b if t else None),
                                 (n.GPU_MEMORY_TOTAL, g.ident.memory_total_b),
                                 (n.GPU_TEMPERATURE, t.temp_c if t else None)):  # fmt: skip
                    if value is not None:
                        gauges[m.name].add_metric(labels, float(value))
                if s.proc_mem_b is not None and owner.run_id:
                    proc_mem.add_metric(labels, float(s.proc_mem_b))
                if dcgm is not None:
                    dcgm.add(g.ident, g.tick, owner, self._hostname, g.energy_total_mj, g.gpu_instance_id)
        out: list[Metric] = [busy, energy, *gauges.values(), proc_mem, unalloc, unattributed]
        return out + (dcgm.families() if dcgm is not None else [])


def serve(metrics: NodeMetrics, port: int, host: str) -> tuple[object, object]:
    """Serve ``/metrics`` on host:port from its own registry; OSError when it cannot bind.

    Always Prometheus' text format 0.0.4, as dcgm-exporter serves: its counter
    ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` has no ``_total`` suffix, which OpenMetrics forbids."""
    from gpuledger.node.metrics_http import start_text_server

    return start_text_server(metrics, port, host)
