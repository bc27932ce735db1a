"""Render run snapshots as Prometheus metric families (prometheus_client's collector protocol)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from gpuledger.prom import names as n
from gpuledger.prom.series import GpuFigures, RunFigures


def _counter(m: n.MetricName) -> CounterMetricFamily:
    return CounterMetricFamily(m.family, m.help, labels=m.labels)


def _gauge(m: n.MetricName) -> GaugeMetricFamily:
    return GaugeMetricFamily(m.name, m.help, labels=m.labels)


GPU_VALUES: tuple[tuple[n.MetricName, Callable[[GpuFigures], float | None]], ...] = (
    (n.GPU_BUSY, lambda g: g.busy_s),
    (n.GPU_ENERGY, lambda g: g.energy_j),
    (n.GPU_POWER, lambda g: g.power_w),
    (n.GPU_MEMORY, lambda g: g.memory_used_b),
    (n.GPU_MEMORY_TOTAL, lambda g: g.memory_total_b),
    (n.GPU_TEMPERATURE, lambda g: g.temperature_c),
)


def families(runs: Iterable[RunFigures]) -> list[Metric]:
    """One family per exported name, each with a sample per run (and GPU) that measured it."""
    gpu_fams = {m.name: (_counter(m) if m.kind == "counter" else _gauge(m)) for m, _ in GPU_VALUES}
    throttle = _counter(n.GPU_THROTTLE)
    cpu = _counter(n.RUN_CPU)
    info = InfoMetricFamily(n.RUN_INFO.family, n.RUN_INFO.help, labels=n.RUN_INFO.labels)
    start, end = _gauge(n.RUN_START), _gauge(n.RUN_END)
    for run in runs:
        key = run.key.values()
        info.add_metric([], run.info_labels())
        if run.started_at is not None:
            start.add_metric(key, run.started_at)
        if run.ended_at is not None:
            end.add_metric(key, run.ended_at)
        if run.cpu_s is not None:
            cpu.add_metric(key, run.cpu_s)
        for gpu in run.gpus:
            labels = gpu.label_values(run.key)
            for m, get in GPU_VALUES:
                value = get(gpu)
                if value is not None:
                    gpu_fams[m.name].add_metric(labels, float(value))
            for reason, seconds in sorted(gpu.throttle_s.items()):
                throttle.add_metric([*labels, reason], seconds)
    return [*gpu_fams.values(), throttle, cpu, info, start, end]


class SnapshotCollector:
    """A prometheus_client collector: ``collect()`` renders whatever ``source()`` returns now."""

    def __init__(self, source: Callable[[], Iterable[RunFigures]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        yield from families(self._source())

    def describe(self) -> list[Metric]:
        return []  # no describe at registration: the source may be slow (a database)
