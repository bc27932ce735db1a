"""Live alerts: a pure evaluator fed the recorder's intervals and the command's messages.

Rules (thresholds in ``AlertRules``, set in a config file: docs/REPORTS.md):

- ``low_util``: a GPU busy under ``low_util_pct`` for ``low_util_minutes`` in a row;
- ``vram``: device memory above ``vram_pct`` of the GPU's memory;
- ``temperature``: a GPU at or above ``temp_c``;
- ``oom``: an out-of-memory event (CUDA or the kernel's OOM killer);
- ``nan_loss``: a non-finite loss or metric.

An alert that stays true is said again every ``repeat_minutes``; a low-utilisation streak fires
once it reaches its length. Times come from the intervals and messages, never from a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from gpuledger.core.model import GpuIdentity, GpuInterval, HostInterval

OOM_KINDS = ("cuda_oom", "oom", "oom_killed", "out_of_memory")
NAN_KINDS = ("nan_loss",)


@dataclass(frozen=True)
class AlertRules:
    low_util: bool = True
    low_util_pct: float = 10.0
    low_util_minutes: float = 10.0
    vram: bool = True
    vram_pct: float = 95.0
    temperature: bool = True
    temp_c: float = 85.0
    oom: bool = True
    nan_loss: bool = True
    repeat_minutes: float = 30.0
    webhook: str | None = None  # JSON POST target; None: stderr and run events only


# Config file layout -> AlertRules field: [alerts] plus one table per rule.
_TABLES: dict[str, dict[str, str]] = {
    "low_util": {"enabled": "low_util", "below_pct": "low_util_pct", "minutes": "low_util_minutes"},
    "vram": {"enabled": "vram", "above_pct": "vram_pct"},
    "temperature": {"enabled": "temperature", "above_c": "temp_c"},
    "oom": {"enabled": "oom"},
    "nan_loss": {"enabled": "nan_loss"},
}
_TOP = {"webhook": "webhook", "repeat_minutes": "repeat_minutes"}


def rules_from_config(config: Mapping[str, Any]) -> AlertRules | None:
    """AlertRules from a parsed config (its ``[alerts]`` table); None when ``enabled = false``.
    Unknown keys are errors (ValueError), so a typo never silently disables an alert."""
    table = config.get("alerts", {})
    if not isinstance(table, Mapping):
        raise ValueError("[alerts] must be a table")
    if table.get("enabled", True) is False:
        return None
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key == "enabled":
            continue
        if key in _TOP:
            values[_TOP[key]] = value
        elif key in _TABLES and isinstance(value, Mapping):
            for sub, v in value.items():
                if sub not in _TABLES[key]:
                    raise ValueError(f"[alerts.{key}]: unknown key {sub!r} (known: {', '.join(_TABLES[key])})")
                values[_TABLES[key][sub]] = v
        else:
            raise ValueError(f"[alerts]: unknown key {key!r} (known: {', '.join([*_TOP, *_TABLES])})")
    types = {f.name: f.type for f in fields(AlertRules)}
    for name, value in values.items():
        want = types[name]
        if "bool" in str(want) and not isinstance(value, bool):
            raise ValueError(f"alerts: {name} must be true or false")
        if "float" in str(want) and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
            raise ValueError(f"alerts: {name} must be a number >= 0")
        if name == "webhook" and value is not None and not str(value).startswith(("http://", "https://")):
            raise ValueError("alerts: webhook must be an http:// or https:// URL")
    return AlertRules(**values)


@dataclass
class Alert:
    rule: str
    t: float
    message: str
    gpu: int | None = None
    payload: dict[str, Any] = field(default_factory=dict)


class AlertEngine:
    """Keeps the little state the rules need (low-utilisation streaks, when each alert last fired)."""

    def __init__(self, rules: AlertRules, devices: Sequence[GpuIdentity]) -> None:
        self.rules = rules
        self._devices = {d.uuid: d for d in devices}
        self._low_since: dict[str, float] = {}
        self._last: dict[tuple[str, str | None], float] = {}

    def _label(self, uuid: str) -> tuple[str, int | None]:
        dev = self._devices.get(uuid)
        return (f"GPU {dev.index}", dev.index) if dev else (f"GPU {uuid[:12]}", None)

    def _due(self, rule: str, key: str | None, t: float) -> bool:
        last = self._last.get((rule, key))
        if last is not None and t - last < self.rules.repeat_minutes * 60:
            return False
        self._last[(rule, key)] = t
        return True

    def on_interval(self, gpu: Sequence[GpuInterval], host: HostInterval | None = None) -> list[Alert]:
        out: list[Alert] = []
        r = self.rules
        for iv in gpu:
            label, index = self._label(iv.device_uuid)
            span = iv.t1 - iv.t0
            if r.low_util and iv.busy_s is not None and span > 0:
                if iv.busy_s / span * 100 < r.low_util_pct:
                    since = self._low_since.setdefault(iv.device_uuid, iv.t0)
                    minutes = (iv.t1 - since) / 60
                    if minutes >= r.low_util_minutes and self._due("low_util", iv.device_uuid, iv.t1):
                        lasted = f"{minutes:.0f} min" if minutes >= 1 else f"{minutes * 60:.0f} s"
                        out.append(
                            Alert(
                                "low_util",
                                iv.t1,
                                f"{label} busy under {r.low_util_pct:g} % for {lasted}",
                                index,
                                {"minutes": minutes},
                            )
                        )
                else:
                    self._low_since.pop(iv.device_uuid, None)
                    self._last.pop(("low_util", iv.device_uuid), None)  # a new streak alerts again
            total = self._devices[iv.device_uuid].memory_total_b if iv.device_uuid in self._devices else None
            if r.vram and total and iv.mem_used_max_b is not None:
                share = iv.mem_used_max_b / total * 100
                if share >= r.vram_pct and self._due("vram", iv.device_uuid, iv.t1):
                    out.append(
                        Alert(
                            "vram",
                            iv.t1,
                            f"{label} memory at {share:.1f} % "
                            f"({iv.mem_used_max_b / 2**30:.1f} of {total / 2**30:.1f} GiB)",
                            index,
                            {"used_b": iv.mem_used_max_b, "total_b": total},
                        )
                    )
            hot = r.temperature and iv.temp_max_c is not None and iv.temp_max_c >= r.temp_c
            if hot and self._due("temperature", iv.device_uuid, iv.t1):
                out.append(
                    Alert(
                        "temperature",
                        iv.t1,
                        f"{label} at {iv.temp_max_c:.0f} °C (limit {r.temp_c:g} °C)",
                        index,
                        {"temp_c": iv.temp_max_c},
                    )
                )
        return out

    def on_event(self, kind: str, message: str, payload: Mapping[str, Any], t: float) -> list[Alert]:
        if kind in OOM_KINDS and self.rules.oom and self._due("oom", kind, t):
            what = "host memory (OOM killer)" if kind == "oom_killed" else "GPU memory"
            recovered = " (recovered)" if payload.get("fatal") is False else ""
            return [
                Alert("oom", t, f"out of {what}{recovered}: {message}".rstrip(": "), payload.get("gpu"), dict(payload))
            ]
        if kind in NAN_KINDS and self.rules.nan_loss and self._due("nan_loss", None, t):
            return [Alert("nan_loss", t, f"non-finite loss: {message}".rstrip(": "), None, dict(payload))]
        return []

    def on_metrics(self, metrics: Mapping[str, Any], t: float, epoch: int | None = None) -> list[Alert]:
        bad = sorted(k for k, v in metrics.items() if not math.isfinite(_float(v)))
        if not bad:
            return []
        where = f" at epoch {epoch}" if epoch is not None else ""
        return self.on_event("nan_loss", f"{', '.join(bad)} not finite{where}", {"keys": bad, "epoch": epoch}, t)


def _float(value: Any) -> float:
    """A metric as a float; what is not a number at all (a label) counts as finite."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0
