"""Anomaly rule: inference slower than the previous version on the same data and hardware (issue 37).

Pure. Each version of a model's line (reports/run/lineage.py) carries its evaluation runs; a version
whose inference ms/image is higher than its previous version's, measured on an evaluation that is
comparable (reports/run/comparability.py: same split, GPU, power limit, device, imgsz, batch,
precision and software), by more than ``min_slowdown_pct``, is flagged. Evaluations that are not
comparable are never set against each other: a slower figure on other hardware says nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpuledger.core.ids import short_id

RULE = "inference_slower"
MIN_SLOWDOWN_PCT = 5.0  # below this, run-to-run noise of a short evaluation


@dataclass(frozen=True)
class InferenceSlower:
    version_run: str  # the training run of the slower version
    previous_run: str  # the training run of the version before it
    evaluation: str  # the evaluation runs compared: this version's ...
    previous_evaluation: str  # ... and the previous version's
    ms: float
    previous_ms: float

    @property
    def slowdown_pct(self) -> float:
        return (self.ms / self.previous_ms - 1.0) * 100.0

    @property
    def message(self) -> str:
        return (
            f"inference slower than the previous version on the same data and hardware: "
            f"{self.ms:.3g} ms/image vs {self.previous_ms:.3g} (+{self.slowdown_pct:.0f} %)"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": RULE,
            "version_run": self.version_run,
            "previous_run": self.previous_run,
            "evaluation": self.evaluation,
            "previous_evaluation": self.previous_evaluation,
            "ms_per_image": self.ms,
            "previous_ms_per_image": self.previous_ms,
            "slowdown_pct": round(self.slowdown_pct, 3),
            "message": self.message,
        }


Comparable = Callable[[Mapping[str, Any], Mapping[str, Any]], bool]


def inference_slower(
    version_run: str,
    previous_run: str,
    evaluations: Sequence[Mapping[str, Any]],
    previous_evaluations: Sequence[Mapping[str, Any]],
    comparable: Comparable,
    min_slowdown_pct: float = MIN_SLOWDOWN_PCT,
) -> InferenceSlower | None:
    """The worst slowdown of ``evaluations`` (dicts with ``run_id`` and ``inference_ms``) against a
    comparable evaluation of the previous version, if above ``min_slowdown_pct``; else None."""
    worst: InferenceSlower | None = None
    for ev in evaluations:
        ms = ev.get("inference_ms")
        if not isinstance(ms, int | float) or ms <= 0:
            continue
        for prev in previous_evaluations:
            prev_ms = prev.get("inference_ms")
            if not isinstance(prev_ms, int | float) or prev_ms <= 0 or not comparable(ev, prev):
                continue
            found = InferenceSlower(version_run, previous_run, ev["run_id"], prev["run_id"], float(ms), float(prev_ms))
            if found.slowdown_pct > min_slowdown_pct and (worst is None or found.slowdown_pct > worst.slowdown_pct):
                worst = found
    return worst


def _plain(ms: float) -> str:
    """Every digit of the float, no exponent and no trailing zero (as the anomalies' money strings)."""
    return format(Decimal(repr(ms)).normalize(), "f")


def value_anomaly(
    found: InferenceSlower,
    *,
    by: str,
    version: str,
    previous_version: str,
    week: str,
    conditions: Mapping[str, Any],
) -> dict[str, Any]:
    """The finding as an entry of the value trends' anomalies (reports/cost/value_trends.py): the
    version's name, ms/image before -> after and the split and GPU both evaluations shared, so a
    reader of the chargeback or the dashboard sees which version got slower where."""
    split, gpu = conditions.get("split"), conditions.get("gpu_model")
    where = ", ".join(
        part
        for part in (
            f"split {split[:12]}" if isinstance(split, str) and split else "",
            f"GPU {gpu}" if gpu else "",
        )
        if part
    )
    cause = (
        f"{version} (evaluation {short_id(found.evaluation)}) infers in {found.ms:.3g} ms/image, "
        f"{previous_version} (evaluation {short_id(found.previous_evaluation)}) in {found.previous_ms:.3g}"
        f"{f' on the same {where}' if where else ' under the same conditions'}"
    )
    return {
        by: version,
        "rule": RULE,
        "metric": "inference_ms_per_image",
        "week": week,
        "previous_version": previous_version,
        "baseline": _plain(found.previous_ms),
        "current": _plain(found.ms),
        "change": round(found.slowdown_pct / 100.0, 6),
        "causes": [{"kind": RULE, "text": cause, "figures": found.as_dict()}],
        "message": (
            f"inference slower than {previous_version} on the same data and hardware: "
            f"{found.previous_ms:.3g} -> {found.ms:.3g} ms/image (+{found.slowdown_pct:.0f} %)"
        ),
    }
