"""Whether two evaluation runs may be compared, and the answer to a claimed speed-up (issue 37).

Pure: the caller hands each run's ``meta["evaluation"]`` and its recorded GPUs (reports/run/compare.py).
Two evaluations are comparable when they saw the same images (split fingerprint), ran on the same
hardware (GPU model, power limit where recorded, device), with the same settings (imgsz, batch,
precision) and the same software (Ultralytics, torch, CUDA, driver). Every condition that differs is
named with both values. A value recorded on one side only is a difference too ("not recorded"): an
equality that cannot be shown is not claimed. A value neither side recorded is not a condition,
except the split fingerprint: "the same test set" is the point of the comparison, so two runs that
both lack it (a discovered evaluation, a fingerprint that failed) are not said to have seen the same data.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NOT_RECORDED = "not recorded"
MINUS = "\u2212"  # a real minus sign in the one-line answer


class ClaimError(ValueError):
    """A --claim that cannot be answered (not a percentage, runs without inference speed)."""


@dataclass(frozen=True)
class Condition:
    key: str
    label: str
    group: str  # "data", "hardware", "settings" or "software"
    required: bool = False  # must be recorded on both sides to count as the same


CONDITIONS: tuple[Condition, ...] = (
    Condition("split", "split fingerprint", "data", required=True),
    Condition("gpu_model", "GPU model", "hardware"),
    Condition("power_limit_w", "GPU power limit", "hardware"),
    Condition("device", "device", "hardware"),
    Condition("imgsz", "imgsz", "settings"),
    Condition("batch", "batch", "settings"),
    Condition("precision", "precision", "settings"),
    Condition("ultralytics", "Ultralytics version", "software"),
    Condition("torch", "torch version", "software"),
    Condition("cuda", "CUDA version", "software"),
    Condition("driver", "driver version", "software"),
)


@dataclass(frozen=True)
class Difference:
    key: str
    label: str
    group: str
    a: str
    b: str

    @property
    def text(self) -> str:
        return f"{self.label} {self.a} vs {self.b}"

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "group": self.group, "a": self.a, "b": self.b, "text": self.text}


@dataclass(frozen=True)
class Verdict:
    differences: tuple[Difference, ...]

    @property
    def comparable(self) -> bool:
        return not self.differences

    def same(self, group: str) -> bool:
        return not any(d.group == group for d in self.differences)

    @property
    def summary(self) -> str:
        if self.comparable:
            return "comparable: same data, same hardware, same settings, same software"
        return "not comparable: " + "; ".join(d.text for d in self.differences)

    def as_dict(self) -> dict[str, Any]:
        return {
            "comparable": self.comparable,
            "same_data": self.same("data"),
            "same_hardware": self.same("hardware"),
            "differences": [d.as_dict() for d in self.differences],
            "summary": self.summary,
        }


def _text(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip() or None


def facts(evaluation: Mapping[str, Any], gpus: Sequence[Mapping[str, Any]] = ()) -> dict[str, str | None]:
    """The conditions' values of one evaluation run. ``gpus``: the run's recorded GPUs (name,
    power_limit_w, driver_version, cuda_version), used where the evaluation itself does not say."""
    split = evaluation.get("split") if isinstance(evaluation.get("split"), Mapping) else {}
    versions = evaluation.get("versions") if isinstance(evaluation.get("versions"), Mapping) else {}
    names = sorted({str(g["name"]) for g in gpus if g.get("name")})
    limits = sorted({float(g["power_limit_w"]) for g in gpus if g.get("power_limit_w")})
    drivers = sorted({str(g["driver_version"]) for g in gpus if g.get("driver_version")})
    cuda = versions.get("cuda") or next((g.get("cuda_version") for g in gpus if g.get("cuda_version")), None)
    return {
        "split": _text(split.get("fingerprint")),
        "gpu_model": _text(evaluation.get("gpu_model")) or (", ".join(names) or None),
        "power_limit_w": ", ".join(f"{w:g} W" for w in limits) or None,
        "device": _text(evaluation.get("device")),
        "imgsz": _text(evaluation.get("imgsz")),
        "batch": _text(evaluation.get("batch")),
        "precision": _text(evaluation.get("precision")),
        "ultralytics": _text(versions.get("ultralytics")),
        "torch": _text(versions.get("torch")),
        "cuda": _text(cuda),
        "driver": ", ".join(drivers) or None,
    }


def _shown(key: str, value: str | None) -> str:
    if value is None:
        return NOT_RECORDED
    return value[:12] if key == "split" else value  # a sha256 reads as its first 12 hex digits


def verdict(a: Mapping[str, str | None], b: Mapping[str, str | None]) -> Verdict:
    """Run B against run A: each condition whose values differ, named with both."""
    found = []
    for cond in CONDITIONS:
        va, vb = a.get(cond.key), b.get(cond.key)
        if va != vb or (cond.required and va is None):
            found.append(Difference(cond.key, cond.label, cond.group, _shown(cond.key, va), _shown(cond.key, vb)))
    return Verdict(tuple(found))


# --- the claimed speed-up -------------------------------------------------------------------------

_CLAIM = re.compile(r"^\s*([+-]?\d+(?:\.\d+)?)\s*%?\s*$")


def parse_claim(text: str) -> float:
    """'30%', '+30 %', '30', '-5%' -> the claimed change in percent; ClaimError otherwise."""
    m = _CLAIM.match(text.replace(MINUS, "-"))
    if not m:
        raise ClaimError(f"--claim {text!r} is not a percentage (e.g. 30% or -5%)")
    return float(m.group(1))


def inference_fps(evaluation: Mapping[str, Any]) -> float | None:
    """Inference-only images per second: the recorded figure, else 1000 / inference ms per image."""
    fps = evaluation.get("fps_inference")
    if isinstance(fps, int | float) and fps > 0:
        return float(fps)
    ms = (evaluation.get("ms_per_image") or {}).get("inference")
    return 1000.0 / ms if isinstance(ms, int | float) and ms > 0 else None


def best_map(evaluation: Mapping[str, Any]) -> float | None:
    for key in ("map50_95", "map50"):
        value = evaluation.get(key)
        if isinstance(value, int | float):
            return float(value)
    return None


def _signed(value: float, digits: int) -> str:
    text = f"{value:+.{digits}f}"
    return text.replace("-", MINUS)


def claim_line(claimed_pct: float, a: Mapping[str, Any], b: Mapping[str, Any], v: Verdict) -> str:
    """The dispute in one line: ``claimed +30 %, measured +12 % (same data, same hardware), mAP −0.4 points``.

    Measured = the change of B's inference FPS over A's. Raises ClaimError when either run has none."""
    fa, fb = inference_fps(a), inference_fps(b)
    if fa is None or fb is None:
        raise ClaimError("--claim needs both runs' inference speed (ms per image); run A or B has none")
    measured = (fb / fa - 1.0) * 100.0
    qualifier = "same data, same hardware" if v.comparable else v.summary
    ma, mb = best_map(a), best_map(b)
    quality = "mAP not recorded" if ma is None or mb is None else f"mAP {_signed((mb - ma) * 100.0, 1)} points"
    return f"claimed {_signed(claimed_pct, 0)} %, measured {_signed(measured, 0)} % ({qualifier}), {quality}"
