"""Ledger interval rows to the ClickHouse columns of series/clickhouse_ddl.py and back.

Every measured float becomes an integer in the unit of series/quantum.py (so what comes back is
``quantize_gpu`` / ``quantize_host`` of what went in); a NaN is no reading, as in the ledger. A row
that does not fit its column (a negative duration, an integral below zero, a value past the
column's range) is refused with the column named, before anything of its batch is stored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gpuledger.series.quantum import GPU_SCALE, HOST_SCALE, THROTTLE_SCALE, from_units, to_units

# ledger column -> (ClickHouse column, scale, lowest value allowed, highest)
_I32 = 2**31 - 1
_I64 = 2**63 - 1
_U32 = 2**32 - 1
GPU_VALUES: dict[str, tuple[str, int, int, int]] = {
    "samples": ("samples", 1, 0, _U32),
    "busy_s": ("busy_ms", GPU_SCALE["busy_s"], 0, _I64),
    "util_idle_s": ("idle_ms", GPU_SCALE["util_idle_s"], 0, _I64),
    "util_unknown_s": ("unknown_ms", GPU_SCALE["util_unknown_s"], 0, _I64),
    "util_unmeasured_s": ("unmeasured_ms", GPU_SCALE["util_unmeasured_s"], 0, _I64),
    "energy_j": ("energy_mj", GPU_SCALE["energy_j"], 0, _I64),
    "power_max_w": ("power_max_mw", GPU_SCALE["power_max_w"], -_I64, _I64),
    "util_max_pct": ("util_max_cp", GPU_SCALE["util_max_pct"], -_I32, _I32),
    "proc_sm_util_avg_pct": ("proc_sm_cp", GPU_SCALE["proc_sm_util_avg_pct"], -_I32, _I32),
    "temp_max_c": ("temp_max_dc", GPU_SCALE["temp_max_c"], -_I32, _I32),
    "sm_clock_avg_mhz": ("sm_clock_dmhz", GPU_SCALE["sm_clock_avg_mhz"], -_I32, _I32),
    "mem_clock_max_mhz": ("mem_clock_dmhz", GPU_SCALE["mem_clock_max_mhz"], -_I32, _I32),
    "mem_used_max_b": ("mem_max_b", 1, -_I64, _I64),
    "mem_used_last_b": ("mem_last_b", 1, -_I64, _I64),
    "mem_reserved_b": ("mem_reserved_b", 1, -_I64, _I64),
    "proc_mem_max_b": ("proc_mem_max_b", 1, -_I64, _I64),
}
GPU_TEXT = ("util_method", "energy_method", "proc_method")
HOST_VALUES: dict[str, tuple[str, int, int, int]] = {
    "samples": ("samples", 1, 0, _U32),
    "cpu_s": ("cpu_ms", HOST_SCALE["cpu_s"], 0, _I64),
    "rss_max_b": ("rss_max_b", 1, -_I64, _I64),
    "read_b": ("read_b", 1, -_I64, _I64),
    "write_b": ("write_b", 1, -_I64, _I64),
    "threads_max": ("threads_max", 1, -_I32, _I32),
    "procs_max": ("procs_max", 1, -_I32, _I32),
    "sys_cpu_util_avg_pct": ("sys_cpu_cp", HOST_SCALE["sys_cpu_util_avg_pct"], -_I32, _I32),
    "iowait_s": ("iowait_ms", HOST_SCALE["iowait_s"], 0, _I64),
    "sys_mem_used_max_b": ("sys_mem_used_max_b", 1, -_I64, _I64),
    "disk_read_b": ("disk_read_b", 1, -_I64, _I64),
    "disk_write_b": ("disk_write_b", 1, -_I64, _I64),
    "net_rx_b": ("net_rx_b", 1, -_I64, _I64),
    "net_tx_b": ("net_tx_b", 1, -_I64, _I64),
}
GPU_INSERT = ("gpu", "t0", "dur_ms", "run", "seq", *(c for c, *_ in GPU_VALUES.values()), *GPU_TEXT)
GPU_INSERT += ("throttle_ms", "throttle_read")
HOST_INSERT = ("run", "t0", "dur_ms", "seq", *(c for c, *_ in HOST_VALUES.values()))


class BadRow(ValueError):
    """An interval the store cannot keep as given (the batch is refused whole)."""


def _units(row: Mapping[str, Any], col: str, scale: int, lo: int, hi: int, where: str) -> int | None:
    v = row.get(col)
    if v is None:
        return None
    if type(v) is float and lo <= (x := v * scale) <= hi:
        # quantum.to_units inline (a dozen values a row): the same float product, rounded half away from zero
        return int(x + 0.5) if x >= 0 else -int(-x + 0.5)
    if isinstance(v, float) and math.isnan(v):
        return None
    try:
        u = to_units(v, scale)
    except (TypeError, ValueError, OverflowError) as e:
        raise BadRow(f"{where}: {col} = {v!r} is not a number") from e
    if u is None or not lo <= u <= hi:
        raise BadRow(f"{where}: {col} = {v!r} is out of range")
    return u


def _time(row: Mapping[str, Any], where: str) -> tuple[str, int, int]:
    """(t0 as the engine's DateTime64 text, t0 in ms, duration in ms)."""
    t0 = _units(row, "t0", 1000, 0, _I64, where)
    t1 = _units(row, "t1", 1000, 0, _I64, where)
    if t0 is None or t1 is None:
        raise BadRow(f"{where}: t0 and t1 are required")
    if not 0 <= t1 - t0 <= _U32:
        raise BadRow(f"{where}: t1 - t0 = {(t1 - t0) / 1000} s is not a duration of 0 to 49 days")
    return f"{t0 // 1000}.{t0 % 1000:03d}", t0, t1 - t0


def _seq(row: Mapping[str, Any], where: str) -> int:
    seq = row.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= _U32:
        raise BadRow(f"{where}: seq = {seq!r} is not a sequence number")
    return seq


def gpu_row(row: Mapping[str, Any], gpu: int, run: int, where: str) -> dict[str, Any]:
    """A ledger ``gpu_intervals`` row as the ClickHouse row to insert."""
    t0, _, dur = _time(row, where)
    out: dict[str, Any] = {"gpu": gpu, "t0": t0, "dur_ms": dur, "run": run, "seq": _seq(row, where)}
    for col, (name, scale, lo, hi) in GPU_VALUES.items():
        out[name] = _units(row, col, scale, lo, hi, where)
    if out["samples"] is None:
        raise BadRow(f"{where}: samples is required")
    for col in GPU_TEXT:
        v = row.get(col)
        if v is not None and not isinstance(v, str):
            raise BadRow(f"{where}: {col} = {v!r} is not text")
        out[col] = v
    throttle = row.get("throttle_s")
    if throttle is not None and not isinstance(throttle, Mapping):
        raise BadRow(f"{where}: throttle_s = {throttle!r} is not a mapping of reason to seconds")
    out["throttle_ms"] = {}
    for reason in throttle or {}:
        ms = _units(throttle, reason, THROTTLE_SCALE, 0, _U32, where)
        if ms is None or not isinstance(reason, str):
            raise BadRow(f"{where}: throttle_s[{reason!r}] = {throttle[reason]!r} is not seconds of a named reason")
        out["throttle_ms"][reason] = ms
    out["throttle_read"] = throttle is not None
    return out


def host_row(row: Mapping[str, Any], run: int, where: str) -> dict[str, Any]:
    t0, _, dur = _time(row, where)
    out: dict[str, Any] = {"run": run, "t0": t0, "dur_ms": dur, "seq": _seq(row, where)}
    for col, (name, scale, lo, hi) in HOST_VALUES.items():
        out[name] = _units(row, col, scale, lo, hi, where)
    for col in ("samples", "cpu_s", "rss_max_b", "read_b", "write_b", "threads_max", "procs_max"):
        if out[HOST_VALUES[col][0]] is None:
            raise BadRow(f"{where}: {col} is required")
    return out


def _back(units: Any, scale: int) -> Any:
    if units is None or scale == 1:
        return units
    return from_units(units, scale)


GPU_SELECT = ("seq", "toUnixTimestamp64Milli(t0)", "dur_ms", *(c for c, *_ in GPU_VALUES.values()), *GPU_TEXT)
GPU_SELECT += ("throttle_ms", "throttle_read")
HOST_SELECT = ("seq", "toUnixTimestamp64Milli(t0)", "dur_ms", *(c for c, *_ in HOST_VALUES.values()))


def gpu_back(device_uuid: str, values: list[Any]) -> dict[str, Any]:
    """A row of GPU_SELECT as the ledger's row (without run_id)."""
    seq, t0, dur, *rest = values
    out: dict[str, Any] = {"device_uuid": device_uuid, "seq": seq, "t0": t0 / 1000, "t1": (t0 + dur) / 1000}
    for (col, (_, scale, _, _)), v in zip(GPU_VALUES.items(), rest, strict=False):
        out[col] = _back(v, scale)
    texts = rest[len(GPU_VALUES) : len(GPU_VALUES) + len(GPU_TEXT)]
    out.update(zip(GPU_TEXT, texts, strict=True))
    throttle, read = rest[-2], rest[-1]
    out["throttle_s"] = {k: from_units(v, THROTTLE_SCALE) for k, v in throttle.items()} if read else None
    return out


def host_back(values: list[Any]) -> dict[str, Any]:
    seq, t0, dur, *rest = values
    out: dict[str, Any] = {"seq": seq, "t0": t0 / 1000, "t1": (t0 + dur) / 1000}
    for (col, (_, scale, _, _)), v in zip(HOST_VALUES.items(), rest, strict=True):
        out[col] = _back(v, scale)
    return out
