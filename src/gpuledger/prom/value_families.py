"""The value of ended runs as Prometheus gauges (names.VALUE): plain figures and their rendering."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from gpuledger.prom import names as n
from gpuledger.prom.series import RunKey, _cut


@dataclass(frozen=True)
class RunValueFigures:
    """One ended run's value; None: not known (the sample is left out, never exported as 0)."""

    key: RunKey
    model: str
    model_version: str
    status: str
    cost: float
    idle_cost: float
    epochs: int
    train_images: int | None
    map50_95_gain: float | None  # 0-1
    busy_gpu_s: float | None
    measured_gpu_s: float | None

    def label_values(self) -> list[str]:
        return [*self.key.values(), _cut(self.model), _cut(self.model_version), self.status]


VALUES: tuple[tuple[n.MetricName, Callable[[RunValueFigures], float | None]], ...] = (
    (n.RUN_COST, lambda v: v.cost),
    (n.RUN_IDLE_COST, lambda v: v.idle_cost),
    (n.RUN_EPOCHS, lambda v: v.epochs),
    (n.RUN_TRAIN_IMAGES, lambda v: v.train_images),
    (n.RUN_MAP_GAIN, lambda v: v.map50_95_gain),
    (n.RUN_BUSY_GPU, lambda v: v.busy_gpu_s),
    (n.RUN_MEASURED_GPU, lambda v: v.measured_gpu_s),
)


def value_families(values: Iterable[RunValueFigures]) -> list[Metric]:
    fams = {m.name: GaugeMetricFamily(m.name, m.help, labels=m.labels) for m, _ in VALUES}
    for v in values:
        labels = v.label_values()
        for m, get in VALUES:
            x = get(v)
            if x is not None:
                fams[m.name].add_metric(labels, float(x))
    return list(fams.values())


class ValueCollector:
    """A prometheus_client collector of whatever ``source()`` returns now."""

    def __init__(self, source: Callable[[], Iterable[RunValueFigures]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        yield from value_families(self._source())

    def describe(self) -> list[Metric]:
        return []
