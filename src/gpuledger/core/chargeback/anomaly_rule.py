"""When a group's value for money got worse: the anomaly rule of the value trends. Pure.

For each group (model_version) and metric (cost per mAP point, per epoch, per 1,000 images), the
last week is compared with the median of the ``baseline_weeks`` weeks before it:

- the last week needs at least ``min_runs`` runs and the metric defined;
- a baseline week counts when it has at least ``min_runs`` runs and the metric defined; at least
  ``min_baseline_weeks`` must count;
- the change is (last week - median) / median; a change of at least ``min_change`` (0.25 = the
  metric rose 25 %) is an anomaly. The median, not the mean: one odd week does not move it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from gpuledger.core.chargeback.value_trends import METRICS, Cell, week_label
from gpuledger.core.money import EXACT

__all__ = ["Anomaly", "AnomalyRule", "find_anomalies"]

_Q = Decimal("0.000001")


@dataclass(frozen=True)
class AnomalyRule:
    """Every number the rule decides with (docs/CHARGEBACK.md, "Value for money over weeks")."""

    baseline_weeks: int = 4
    min_baseline_weeks: int = 2
    min_runs: int = 3
    min_change: float = 0.25
    metrics: tuple[str, ...] = METRICS

    def __post_init__(self) -> None:
        if self.baseline_weeks < 1 or not 1 <= self.min_baseline_weeks <= self.baseline_weeks:
            raise ValueError("the anomaly rule needs 1 <= min_baseline_weeks <= baseline_weeks")
        if self.min_runs < 1 or not self.min_change > 0:
            raise ValueError("the anomaly rule needs min_runs >= 1 and min_change > 0")
        unknown = set(self.metrics) - set(METRICS)
        if unknown:
            raise ValueError(f"unknown value metrics: {', '.join(sorted(unknown))}")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "metrics": list(self.metrics)}


@dataclass
class Anomaly:
    group: str
    metric: str
    week: float  # start of the week that got worse
    baseline_weeks: list[float]  # the weeks the median was taken over
    baseline: Decimal  # their median
    current: Decimal
    change: Decimal  # (current - baseline) / baseline, 6 places
    causes: list[Any] = field(default_factory=list)  # anomaly_causes.Cause, filled by the caller
    message: str = ""

    def as_dict(self, by: str) -> dict[str, Any]:
        return {
            by: self.group,
            "metric": self.metric,
            "week": week_label(self.week),
            "baseline_weeks": [week_label(w) for w in self.baseline_weeks],
            "baseline": format(self.baseline, "f"),
            "current": format(self.current, "f"),
            "change": float(self.change),
            "causes": [c.as_dict() for c in self.causes],
            "message": self.message,
        }


def find_anomalies(
    cells: Mapping[tuple[str, float], Cell], weeks: Sequence[float], rule: AnomalyRule | None = None
) -> list[Anomaly]:
    """The anomalies of the last of ``weeks`` (week starts, oldest first), largest change first."""
    rule = rule or AnomalyRule()
    if len(weeks) < 2:
        return []
    current_week = weeks[-1]
    earlier = list(weeks[-1 - rule.baseline_weeks : -1])
    out = []
    for group in sorted({g for g, _ in cells}):
        now = cells.get((group, current_week))
        if now is None or now.runs < rule.min_runs:
            continue
        for metric in rule.metrics:
            current = now.metric(metric)
            if current is None:
                continue
            counted = [w for w in earlier if _usable(cells.get((group, w)), metric, rule)]
            if len(counted) < rule.min_baseline_weeks:
                continue
            baseline = statistics.median(cells[(group, w)].metric(metric) for w in counted)  # type: ignore[type-var]
            if baseline <= 0:
                continue
            change = EXACT.divide(current - baseline, baseline).quantize(_Q, ROUND_HALF_EVEN, EXACT)
            if change >= Decimal(repr(rule.min_change)):
                out.append(Anomaly(group, metric, current_week, counted, baseline, current, change))
    return sorted(out, key=lambda a: (-a.change, a.group, rule.metrics.index(a.metric)))


def _usable(cell: Cell | None, metric: str, rule: AnomalyRule) -> bool:
    return cell is not None and cell.runs >= rule.min_runs and cell.metric(metric) is not None
