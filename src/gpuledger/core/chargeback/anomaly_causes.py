"""The likely causes of a value anomaly: the week's runs against the baseline weeks' runs. Pure.

Each cause is a function ``(week's runs, baseline runs, thresholds) -> Cause | None`` with its own
threshold in ``CauseThresholds``; ``explain`` runs them all and writes the message, e.g. "cost per
mAP point of yolov5m runs rose 35 % last week (2026-W10): 4.10 -> 5.54 USD; likely cause:
utilisation fell from 81 % to 52 % after batch changed 64 → 16".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpuledger.core.chargeback.anomaly_rule import Anomaly
from gpuledger.core.chargeback.value_trends import RunValue, week_label
from gpuledger.core.money import UH_PER_H, money_decimal

__all__ = ["CAUSES", "FINDING_NAMES", "METRIC_NAMES", "SETTINGS", "Cause", "CauseThresholds", "causes_of", "explain"]

# The settings whose change can explain a change in value for money, as the report names them.
SETTINGS = ("batch", "imgsz", "workers", "gpu_model", "dataset")
# Diagnosis rules (core/diagnosis/rules.py) whose appearance can explain it, in plain words.
FINDING_NAMES = {
    "input_pipeline": "input-pipeline bound",
    "underused": "GPU under-used",
    "idle_gpus": "GPUs held idle",
    "throttling": "GPU throttled",
    "memory_leak": "GPU memory leaking",
    "oom_crash": "out of memory",
}
METRIC_NAMES = {
    "cost_per_map_point": "cost per mAP point",
    "cost_per_epoch": "cost per epoch",
    "cost_per_1k_images": "cost per 1,000 training images",
}


@dataclass(frozen=True)
class CauseThresholds:
    busy_drop: float = 0.10  # utilisation (busy share) fell by at least 10 percentage points
    finding_rise: float = 0.25  # the share of runs with a finding rose by at least 25 points
    failed_rise: float = 0.20  # the share of failed, killed or lost runs rose by at least 20 points
    price_rise: float = 0.10  # cost per held GPU-hour rose by at least 10 %
    map_drop: float = 0.10  # mAP points gained per run fell by at least 10 %


@dataclass(frozen=True)
class Cause:
    kind: str  # "utilisation_fell", "setting_changed", "finding", "more_failures", "price_rose", "map_fell"
    text: str
    figures: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "figures": self.figures}


def _pct(ratio: float) -> str:
    return f"{ratio * 100:.0f} %"


def _amount(value: Decimal) -> str:
    """Money per unit for people: cents from 1 up, four places below (0.1715 per mAP point)."""
    return f"{value:,.2f}" if abs(value) >= 1 else f"{value:.4f}"


def _busy(runs: Sequence[RunValue]) -> float | None:
    measured = sum(r.measured_uh for r in runs)
    return None if measured <= 0 else sum(r.busy_uh for r in runs) / measured


def utilisation_fell(now: Sequence[RunValue], before: Sequence[RunValue], th: CauseThresholds) -> Cause | None:
    """The busy share of the week's GPU time fell by ``busy_drop`` or more."""
    a, b = _busy(before), _busy(now)
    if a is None or b is None or a - b < th.busy_drop:
        return None
    return Cause("utilisation_fell", f"utilisation fell from {_pct(a)} to {_pct(b)}", {"before": a, "now": b})


def _mode(runs: Sequence[RunValue], key: str) -> Any:
    values = Counter(str(r.settings[key]) for r in runs if r.settings.get(key) is not None)
    if not values:
        return None
    return min(values.items(), key=lambda kv: (-kv[1], kv[0]))[0]  # most common; ties: smallest text


def setting_changed(key: str) -> Callable[[Sequence[RunValue], Sequence[RunValue], CauseThresholds], Cause | None]:
    """The most common value of setting ``key`` (batch, imgsz, ...) differs from the baseline's."""

    def check(now: Sequence[RunValue], before: Sequence[RunValue], th: CauseThresholds) -> Cause | None:
        a, b = _mode(before, key), _mode(now, key)
        if a is None or b is None or a == b:
            return None
        return Cause("setting_changed", f"{key} changed {a} → {b}", {"setting": key, "before": a, "now": b})

    check.__name__ = f"{key}_changed"
    return check


def finding(rule: str) -> Callable[[Sequence[RunValue], Sequence[RunValue], CauseThresholds], Cause | None]:
    """The share of runs the diagnosis found ``rule`` in (input_pipeline, ...) rose by
    ``finding_rise``; shares among the runs that were diagnosed."""

    def check(now: Sequence[RunValue], before: Sequence[RunValue], th: CauseThresholds) -> Cause | None:
        now = [r for r in now if r.diagnosed]
        before = [r for r in before if r.diagnosed]
        if not now or not before:
            return None
        n_now = sum(rule in r.findings for r in now)
        n_before = sum(rule in r.findings for r in before)
        if n_now == 0 or n_now / len(now) - n_before / len(before) < th.finding_rise:
            return None
        text = f"{FINDING_NAMES[rule]} in {n_now} of {len(now)} runs ({n_before} of {len(before)} before)"
        return Cause(
            "finding",
            text,
            {"rule": rule, "now": n_now, "runs": len(now), "before": n_before, "baseline_runs": len(before)},
        )

    check.__name__ = f"{rule}_appeared"
    return check


def more_failures(now: Sequence[RunValue], before: Sequence[RunValue], th: CauseThresholds) -> Cause | None:
    """The share of failed, killed or lost runs rose by ``failed_rise``."""
    if not now or not before:
        return None
    f_now, f_before = sum(r.failed for r in now), sum(r.failed for r in before)
    if f_now / len(now) - f_before / len(before) < th.failed_rise:
        return None
    text = f"{f_now} of {len(now)} runs failed, were killed or lost ({f_before} of {len(before)} before)"
    return Cause(
        "more_failures", text, {"now": f_now, "runs": len(now), "before": f_before, "baseline_runs": len(before)}
    )


def _per_held_hour(runs: Sequence[RunValue]) -> Decimal | None:
    held = sum(r.alloc_uh for r in runs)
    return None if held <= 0 else money_decimal(sum(r.cost for r in runs)) * UH_PER_H / held


def price_rose(now: Sequence[RunValue], before: Sequence[RunValue], th: CauseThresholds) -> Cause | None:
    """Cost per held GPU-hour rose by ``price_rise`` (dearer GPUs, a new rate card, energy)."""
    a, b = _per_held_hour(before), _per_held_hour(now)
    if a is None or b is None or a <= 0 or (b - a) / a < Decimal(repr(th.price_rise)):
        return None
    text = f"cost per GPU-hour held rose from {_amount(a)} to {_amount(b)}"
    return Cause("price_rose", text, {"before": format(a, "f"), "now": format(b, "f")})


def map_fell(now: Sequence[RunValue], before: Sequence[RunValue], th: CauseThresholds) -> Cause | None:
    """mAP points gained per run fell by ``map_drop`` (worse results for the same spend)."""
    if not now or not before:
        return None
    a = sum((r.map_points for r in before), Decimal(0)) / len(before)
    b = sum((r.map_points for r in now), Decimal(0)) / len(now)
    if a <= 0 or (a - b) / a < Decimal(repr(th.map_drop)):
        return None
    return Cause(
        "map_fell", f"mAP gained per run fell from {a:.1f} to {b:.1f} points", {"before": float(a), "now": float(b)}
    )


CAUSES: tuple[Callable[[Sequence[RunValue], Sequence[RunValue], CauseThresholds], Cause | None], ...] = (
    *(setting_changed(k) for k in SETTINGS),
    utilisation_fell,
    *(finding(rule) for rule in FINDING_NAMES),
    more_failures,
    price_rose,
    map_fell,
)


def causes_of(now: Sequence[RunValue], before: Sequence[RunValue], th: CauseThresholds | None = None) -> list[Cause]:
    th = th or CauseThresholds()
    return [c for c in (check(now, before, th) for check in CAUSES) if c is not None]


def cause_text(causes: Sequence[Cause]) -> str:
    """The causes as one phrase: a utilisation drop is said to come "after" the settings that
    changed, since those are what moved it."""
    settings = [c for c in causes if c.kind == "setting_changed"]
    drop = next((c for c in causes if c.kind == "utilisation_fell"), None)
    rest = [c for c in causes if c.kind not in ("setting_changed", "utilisation_fell")]
    parts = []
    if drop is not None and settings:
        parts.append(f"{drop.text} after {' and '.join(c.text for c in settings)}")
    else:
        parts += [c.text for c in (*settings, *([drop] if drop else []))]
    parts += [c.text for c in rest]
    return "; ".join(parts)


def headline(anomaly: Anomaly, currency: str = "") -> str:
    """'cost per mAP point of yolov5m runs rose 35 % last week (2026-W10): 4.10 → 5.54 USD'."""
    unit = f" {currency}" if currency else ""
    return (
        f"{METRIC_NAMES[anomaly.metric]} of {anomaly.group} runs rose {_pct(float(anomaly.change))} last week "
        f"({week_label(anomaly.week)}): {_amount(anomaly.baseline)} → {_amount(anomaly.current)}{unit} "
        f"(median of {len(anomaly.baseline_weeks)} weeks before)"
    )


def explain(
    anomaly: Anomaly,
    now: Sequence[RunValue],
    before: Sequence[RunValue],
    *,
    currency: str = "",
    th: CauseThresholds | None = None,
) -> None:
    """Fill ``anomaly.causes`` and ``anomaly.message`` from the week's and the baseline's runs."""
    anomaly.causes = causes_of(now, before, th)
    why = (
        f"likely cause: {cause_text(anomaly.causes)}"
        if anomaly.causes
        else "no likely cause found in the runs' settings, results or diagnosis"
    )
    anomaly.message = f"{headline(anomaly, currency)}; {why}"
