"""The units every compact series layout stores (docs/SCALE.md, "One compact raw-interval layout").

Each measured float is kept as an integer count of a small unit, so a column compresses and sums
exactly; integers the ledger already keeps exactly (bytes, counts) stay as they are. ``quantize_*``
rounds a ledger row to these units and back: the row a series store returns for an interval is
``quantize_gpu(row)`` of the row it was given, on every backend, so a seal taken over what a store
returns does not depend on which store it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# column -> how many of the stored unit make one of the ledger's unit
GPU_SCALE: dict[str, int] = {
    "t0": 1000,  # ms since the epoch
    "t1": 1000,
    "busy_s": 1000,  # ms
    "util_idle_s": 1000,
    "util_unknown_s": 1000,
    "util_unmeasured_s": 1000,
    "energy_j": 1000,  # mJ
    "power_max_w": 1000,  # mW, NVML's own unit
    "util_max_pct": 100,  # 0.01 %
    "proc_sm_util_avg_pct": 100,
    "temp_max_c": 10,  # 0.1 °C
    "sm_clock_avg_mhz": 10,  # 0.1 MHz (an average of whole MHz)
    "mem_clock_max_mhz": 10,
}
THROTTLE_SCALE = 1000  # throttle_s values: ms per reason
HOST_SCALE: dict[str, int] = {
    "t0": 1000,
    "t1": 1000,
    "cpu_s": 1000,
    "iowait_s": 1000,
    "sys_cpu_util_avg_pct": 100,
}


def to_units(value: float | None, scale: int) -> int | None:
    """``value`` in the stored unit, rounded half away from zero (never banker's rounding: the same
    integer on every backend and in Python)."""
    if value is None:
        return None
    v = float(value) * scale
    return int(v + 0.5) if v >= 0 else -int(-v + 0.5)


def from_units(units: int | None, scale: int) -> float | None:
    return None if units is None else units / scale


def _quantize(row: Mapping[str, Any], scales: Mapping[str, int]) -> dict[str, Any]:
    out = dict(row)
    for column, scale in scales.items():
        if column in out:
            out[column] = from_units(to_units(out[column], scale), scale)
    return out


def quantize_gpu(row: Mapping[str, Any]) -> dict[str, Any]:
    """A GPU interval row (the ledger's ``gpu_intervals`` columns) as a compact store returns it."""
    out = _quantize(row, GPU_SCALE)
    throttle = out.get("throttle_s")
    if throttle is not None:
        out["throttle_s"] = {k: from_units(to_units(v, THROTTLE_SCALE), THROTTLE_SCALE) for k, v in throttle.items()}
    return out


def quantize_host(row: Mapping[str, Any]) -> dict[str, Any]:
    """A host interval row (the ledger's ``host_intervals`` columns) as a compact store returns it."""
    return _quantize(row, HOST_SCALE)
