"""Per-run snapshots of the exported figures: plain data, shared by the live exporter and the server.

Counters are running sums of interval integrals; gauges are the latest interval's values.
``None`` means not measured (the sample is left out, never exported as 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuledger.prom.names import MAX_LABEL_CHARS


@dataclass(frozen=True)
class RunKey:
    """The labels every series of a run carries."""

    run_id: str
    project: str = ""
    team: str = ""
    user: str = ""

    def values(self) -> list[str]:
        return [self.run_id, _cut(self.project), _cut(self.team), _cut(self.user)]


@dataclass
class GpuFigures:
    uuid: str
    index: int | None = None
    busy_s: float | None = None
    energy_j: float | None = None
    throttle_s: dict[str, float] = field(default_factory=dict)
    power_w: float | None = None
    memory_used_b: int | None = None
    memory_total_b: int | None = None
    temperature_c: float | None = None

    def label_values(self, key: RunKey) -> list[str]:
        return ["" if self.index is None else str(self.index), self.uuid, *key.values()]


@dataclass
class RunFigures:
    key: RunKey
    name: str = ""
    status: str = "running"
    replayed: bool = False  # metered from a replayed GPU trace (--replay-gpus), not real hardware
    started_at: float | None = None
    ended_at: float | None = None
    cpu_s: float | None = None
    gpus: list[GpuFigures] = field(default_factory=list)

    def info_labels(self) -> dict[str, str]:
        k = self.key
        return {
            "run_id": k.run_id,
            "project": _cut(k.project),
            "team": _cut(k.team),
            "user": _cut(k.user),
            "name": _cut(self.name),
            "status": self.status,
            "replayed": "true" if self.replayed else "false",
        }


def _cut(text: str | None) -> str:
    text = text or ""
    return text if len(text) <= MAX_LABEL_CHARS else text[: MAX_LABEL_CHARS - 1] + "…"


MICRO = 1_000_000  # seconds -> integer µs
MILLI = 1_000  # joules -> integer mJ


def units(value: object, scale: int) -> int | None:
    """A reading as integer micro-units (µs, mJ), so running sums are exact and independent of the
    order of the additions; None (not measured) and non-finite readings stay None."""
    if value is None:
        return None
    v = float(value)  # type: ignore[arg-type]
    return math.floor(v * scale + 0.5) if math.isfinite(v) else None


def add(total: int | None, value: int | None) -> int | None:
    """A running sum where absent stays absent until a first measured value arrives."""
    if value is None:
        return total
    return value if total is None else total + value


def scaled(total: int | None, scale: int) -> float | None:
    return None if total is None else total / scale
