"""Ledger interval rows <-> the compact PostgreSQL row (docs/SCALE.md, "Compact PostgreSQL").

A GPU interval is stored in the fixed-point units of series/quantum.py, in int4/int2 columns, with
three rules that keep the common row short without losing anything:

- the *shape* (a small int2 code, table ``shapes``) holds what repeats from row to row: the three
  method strings, which measured columns are None, and which throttle reasons the row names;
- a column stores SQL NULL when its value is its default: 0 for most (an idle GPU's busy, proc and
  throttle time), ``mem_used_max_b`` for ``mem_used_last_b``; None itself is in the shape, so a NULL
  is never ambiguous. PostgreSQL stores a NULL as one bit, so zeros and repeats cost nothing;
- a value that does not fit its compact column (memory not a whole MiB, a clock past int2, a
  throttle reason nobody listed, ``mem_reserved_b`` unlike its stream's) goes to the row's ``extra``
  jsonb as its exact integer units, which wins over the column when decoding.

``idle`` is stored, not derived: a sampled but not busy moment is neither busy, idle, unknown nor
unmeasured (core/metering/busy.py), so ``dur - busy - unknown - unmeasured`` is not the idle time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuledger.series import quantum

DAY_MS = 86_400_000
INT2 = (-(2**15), 2**15 - 1)
INT4 = (-(2**31), 2**31 - 1)
# The days a row can be on: its day partition is FOR VALUES FROM (day) TO (day + 1), both int2.
DAYS = (INT2[0], INT2[1] - 1)
MIB = 2**20

# Every key of a ledger GPU row (store/schema.py gpu_intervals, without run_id).
GPU_ROW_KEYS = (
    "device_uuid", "seq", "t0", "t1", "samples", "busy_s", "util_method", "util_max_pct", "util_idle_s",
    "util_unknown_s", "util_unmeasured_s", "energy_j", "energy_method", "power_max_w", "mem_used_max_b",
    "mem_used_last_b", "mem_reserved_b", "proc_mem_max_b", "proc_sm_util_avg_pct", "proc_method", "temp_max_c",
    "sm_clock_avg_mhz", "mem_clock_max_mhz", "throttle_s",
)  # fmt: skip
HOST_ROW_KEYS = (
    "seq", "t0", "t1", "samples", "cpu_s", "rss_max_b", "read_b", "write_b", "threads_max", "procs_max",
    "sys_cpu_util_avg_pct", "iowait_s", "sys_mem_used_max_b", "disk_read_b", "disk_write_b", "net_rx_b", "net_tx_b",
)  # fmt: skip
# Throttle reasons with a column of their own (collect/nvml_throttle.py names); others go to extra.
THROTTLE_REASONS = (
    "power", "thermal", "hw_slowdown", "sync_boost", "board_limit", "low_util", "reliability", "hw_power_brake",
)  # fmt: skip


@dataclass(frozen=True)
class Col:
    """One ledger value in one compact column: ``units = to_units(value, scale)``, stored as
    ``units // div`` when exact and in ``lo..hi``."""

    key: str  # the ledger's column
    name: str  # the compact column
    sql: str  # its type
    scale: int = 1  # quantum's units per ledger unit (1: an integer the ledger keeps exactly)
    div: int = 1
    nullable: bool = True  # the ledger allows None
    default_from: str | None = None  # NULL means "the units of this other column", not 0

    @property
    def bounds(self) -> tuple[int, int]:
        return INT2 if self.sql == "int2" else INT4


# Widest first, so no alignment padding falls between them (int4s, then int2s, then the varlena).
GPU_VALUES: tuple[Col, ...] = (
    Col("busy_s", "busy_ms", "int4", 1000),
    Col("util_idle_s", "idle_ms", "int4", 1000),
    Col("util_unknown_s", "unknown_ms", "int4", 1000),
    Col("util_unmeasured_s", "unmeasured_ms", "int4", 1000),
    Col("energy_j", "energy_mj", "int4", 1000),
    Col("power_max_w", "power_mw", "int4", 1000),
    Col("mem_used_max_b", "mem_max_mib", "int4", 1, MIB),
    Col("mem_used_last_b", "mem_last_mib", "int4", 1, MIB, default_from="mem_used_max_b"),
    Col("proc_mem_max_b", "proc_mem_mib", "int4", 1, MIB),
    Col("samples", "samples", "int2", nullable=False),
    Col("util_max_pct", "util_max_cp", "int2", 100),
    Col("proc_sm_util_avg_pct", "proc_sm_cp", "int2", 100),
    Col("temp_max_c", "temp_dc", "int2", 10),
    Col("sm_clock_avg_mhz", "sm_clock_dmhz", "int2", 10),
    Col("mem_clock_max_mhz", "mem_clock_mhz", "int2", 10, 10),
)
_BY_KEY = {c.key: c for c in GPU_VALUES}
_INT4_VALUES = [c for c in GPU_VALUES if c.sql == "int4"]
_INT2_VALUES = [c for c in GPU_VALUES if c.sql == "int2"]
# The shape's None bits, one per nullable ledger column (the order is part of the stored format).
NULLABLE = (*(c.key for c in GPU_VALUES if c.nullable), "mem_reserved_b")

# The compact GPU row: (column, type), in table order.
GPU_COLUMNS: tuple[tuple[str, str], ...] = (
    ("stream", "int4"),
    ("seq", "int4"),
    ("t_ms", "int4"),
    ("dur_ms", "int4"),
    *((c.name, c.sql) for c in _INT4_VALUES),
    *((f"thr_{r}", "int4") for r in THROTTLE_REASONS),
    ("day", "int2"),
    ("shape", "int2"),
    *((c.name, c.sql) for c in _INT2_VALUES),
    ("extra", "jsonb"),
)
GPU_NOT_NULL = ("stream", "seq", "t_ms", "dur_ms", "day", "shape")
GPU_NAMES = tuple(name for name, _ in GPU_COLUMNS)

# The host row: one per run and interval, an eighth of the GPU rows; plain nullable columns.
HOST_COLUMNS: tuple[tuple[str, str], ...] = (
    ("cpu_ms", "int8"), ("rss_max_b", "int8"), ("read_b", "int8"), ("write_b", "int8"), ("iowait_ms", "int8"),
    ("sys_mem_used_max_b", "int8"), ("disk_read_b", "int8"), ("disk_write_b", "int8"), ("net_rx_b", "int8"),
    ("net_tx_b", "int8"), ("run", "int4"), ("seq", "int4"), ("t_ms", "int4"), ("dur_ms", "int4"),
    ("samples", "int4"), ("threads_max", "int4"), ("procs_max", "int4"), ("sys_cpu_cp", "int4"), ("day", "int2"),
)  # fmt: skip
HOST_NOT_NULL = ("cpu_ms", "rss_max_b", "read_b", "write_b", "run", "seq", "t_ms", "dur_ms", "samples",
                 "threads_max", "procs_max", "day")  # fmt: skip
HOST_NAMES = tuple(name for name, _ in HOST_COLUMNS)
# host compact column -> (ledger column, quantum scale)
_HOST_MAP: dict[str, tuple[str, int]] = {
    "cpu_ms": ("cpu_s", 1000), "iowait_ms": ("iowait_s", 1000), "sys_cpu_cp": ("sys_cpu_util_avg_pct", 100),
    **{k: (k, 1) for k in ("rss_max_b", "read_b", "write_b", "sys_mem_used_max_b", "disk_read_b", "disk_write_b",
                           "net_rx_b", "net_tx_b", "samples", "threads_max", "procs_max")},
}  # fmt: skip


@dataclass(frozen=True)
class Shape:
    """What a row shares with many others, stored once in ``shapes`` under a small code."""

    util_method: str | None
    energy_method: str | None
    proc_method: str | None
    nulls: int  # bit i: NULLABLE[i] is None
    throttle: tuple[str, ...] | None  # the reasons the row's throttle_s names; None: throttle_s is None


@dataclass(frozen=True)
class Encoded:
    """A GPU row before its stream and shape codes are known."""

    device_uuid: str
    day: int
    values: dict[str, Any]  # compact column -> value (without stream, shape)
    shape: Shape
    mem_reserved_units: int | None


def _check_keys(row: Mapping[str, Any], keys: tuple[str, ...], what: str) -> None:
    if row.keys() != set(keys):
        missing, unknown = sorted(set(keys) - set(row)), sorted(set(row) - set(keys))
        raise ValueError(f"{what} row seq={row.get('seq')!r}: missing {missing}, unknown {unknown}")


def _units(value: Any, scale: int, key: str) -> int:
    # The common cases first, inline (a write converts some twenty values per row).
    kind = type(value)
    if kind is float and scale != 1 and -1e300 < value < 1e300:
        v = value * scale
        return int(v + 0.5) if v >= 0 else -int(-v + 0.5)  # quantum.to_units
    if kind is int and scale == 1:
        return value  # type: ignore[no-any-return]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key}={value!r}: not a number")
    if not math.isfinite(value):
        raise ValueError(f"{key}={value!r}: not a finite number (an unmeasured value is None)")
    if scale == 1 and value != int(value):
        raise ValueError(f"{key}={value!r}: not a whole number")
    return int(value) if scale == 1 else quantum.to_units(value, scale)  # type: ignore[return-value]


def split_time(t0: Any, t1: Any, what: str) -> tuple[int, int, int]:
    """(day, ms into the day, duration ms) of an interval [t0, t1] in seconds."""
    a, b = _units(t0, 1000, "t0"), _units(t1, 1000, "t1")
    day, t_ms = divmod(a, DAY_MS)
    dur = b - a
    if not 0 <= dur <= INT4[1]:
        raise ValueError(f"{what}: t1 - t0 = {dur} ms, outside 0..{INT4[1]} ms (24.8 days)")
    if not DAYS[0] <= day <= DAYS[1]:
        raise ValueError(f"{what}: t0 = {t0!r} is outside the days a partition can name (1880-04-14 to 2059-09-17)")
    return day, t_ms, dur


# Per value column: (ledger key, compact column, scale, div, lo, hi, default_from, nullable, None bit)
_PLAN = tuple(
    (
        c.key,
        c.name,
        c.scale,
        c.div,
        *c.bounds,
        c.default_from,
        c.nullable,
        1 << NULLABLE.index(c.key) if c.nullable else 0,
    )
    for c in GPU_VALUES
)
_GPU_KEYSET = frozenset(GPU_ROW_KEYS)
_NO_THROTTLE = {f"thr_{r}": None for r in THROTTLE_REASONS}
_METHODS = ("util_method", "energy_method", "proc_method")


def encode_gpu(row: Mapping[str, Any]) -> Encoded:
    """A ledger GPU row as compact values; raises ValueError naming the column that is not valid."""
    if row.keys() != _GPU_KEYSET:
        _check_keys(row, GPU_ROW_KEYS, "GPU interval")
    uuid = row["device_uuid"]
    if not isinstance(uuid, str) or not uuid:
        raise ValueError(f"GPU interval seq={row['seq']!r}: device_uuid {uuid!r} is not a name")
    seq = _units(row["seq"], 1, "seq")
    if not INT4[0] <= seq <= INT4[1]:
        raise ValueError(f"seq={seq} does not fit int4")
    day, t_ms, dur = split_time(row["t0"], row["t1"], f"GPU interval {uuid} seq={seq}")
    values: dict[str, Any] = {"seq": seq, "t_ms": t_ms, "dur_ms": dur, "day": day}
    extra: dict[str, Any] = {}
    nulls = 0
    units: dict[str, int] = {}
    for key, name, scale, div, lo, hi, default_from, nullable, bit in _PLAN:
        value = row[key]
        if value is None:
            if not nullable:
                raise ValueError(f"GPU interval {uuid} seq={seq}: {key} may not be None")
            nulls |= bit
            values[name] = None
            continue
        # _units' common cases inline: some fifteen values a row, 96 rows a push
        kind = type(value)
        if kind is float and scale != 1 and -1e300 < value < 1e300:
            v = value * scale
            u = int(v + 0.5) if v >= 0 else -int(-v + 0.5)  # quantum.to_units
        elif kind is int and scale == 1:
            u = value
        else:
            u = _units(value, scale, key)
        units[key] = u
        if u == (units.get(default_from, 0) if default_from else 0):
            values[name] = None
        elif u % div == 0 and lo <= u // div <= hi:
            values[name] = u // div
        else:
            values[name] = None
            extra[key] = u
    reserved = row["mem_reserved_b"]
    if reserved is None:
        nulls |= 1 << NULLABLE.index("mem_reserved_b")
        reserved_units = None
    else:
        reserved_units = _units(reserved, 1, "mem_reserved_b")
    throttle = row["throttle_s"]
    reasons: tuple[str, ...] | None = None
    values.update(_NO_THROTTLE)
    if throttle is not None:
        if not isinstance(throttle, Mapping):
            raise ValueError(f"GPU interval {uuid} seq={seq}: throttle_s {throttle!r} is not a mapping")
        reasons = tuple(sorted(throttle))
        for reason, seconds in throttle.items():
            u = _units(seconds, quantum.THROTTLE_SCALE, f"throttle_s[{reason!r}]")
            if reason in THROTTLE_REASONS and INT4[0] <= u <= INT4[1]:
                values[f"thr_{reason}"] = u or None
            else:
                extra.setdefault("throttle_s", {})[reason] = u
    values["extra"] = extra or None
    methods = (row["util_method"], row["energy_method"], row["proc_method"])
    for name, method in zip(_METHODS, methods, strict=True):
        if method is not None and type(method) is not str and not isinstance(method, str):
            raise ValueError(f"GPU interval {uuid} seq={seq}: {name} {method!r} is not text")
    return Encoded(uuid, day, values, Shape(*methods, nulls, reasons), reserved_units)


def reserved_extra(enc: Encoded, stream_reserved: int | None) -> dict[str, Any]:
    """``enc``'s compact values with mem_reserved_b in extra where it differs from its stream's."""
    values = enc.values
    if enc.mem_reserved_units is not None and enc.mem_reserved_units != stream_reserved:
        values = {**values, "extra": {**(values["extra"] or {}), "mem_reserved_b": enc.mem_reserved_units}}
    return values


def gpu_units(row: Mapping[str, Any], shape: Shape, stream_reserved: int | None) -> dict[str, int | None]:
    """The ledger values of a stored row (``row``: compact column -> value) in quantum's units:
    ledger column -> integer units, None where not measured. t0 is ms since the epoch."""
    extra = row.get("extra") or {}
    out: dict[str, int | None] = {
        "t0": row["day"] * DAY_MS + row["t_ms"],
        "dur_ms": row["dur_ms"],
    }
    for col in GPU_VALUES:
        if col.nullable and shape.nulls >> NULLABLE.index(col.key) & 1:
            out[col.key] = None
        elif col.key in extra:
            out[col.key] = int(extra[col.key])
        elif row[col.name] is not None:
            out[col.key] = row[col.name] * col.div
        else:
            out[col.key] = (out[col.default_from] or 0) if col.default_from else 0
    if shape.nulls >> NULLABLE.index("mem_reserved_b") & 1:
        out["mem_reserved_b"] = None
    else:
        out["mem_reserved_b"] = int(extra.get("mem_reserved_b", stream_reserved))  # type: ignore[arg-type]
    return out


def decode_gpu(row: Mapping[str, Any], shape: Shape, uuid: str, stream_reserved: int | None) -> dict[str, Any]:
    """The ledger row (without run_id) a stored row holds: quantum.quantize_gpu of what was written."""
    u = gpu_units(row, shape, stream_reserved)
    t0 = u["t0"]
    out: dict[str, Any] = {
        "device_uuid": uuid,
        "seq": row["seq"],
        "t0": t0 / 1000,  # type: ignore[operator]
        "t1": (t0 + row["dur_ms"]) / 1000,  # type: ignore[operator]
        "util_method": shape.util_method,
        "energy_method": shape.energy_method,
        "proc_method": shape.proc_method,
        "mem_reserved_b": u["mem_reserved_b"],
    }
    for col in GPU_VALUES:
        v = u[col.key]
        out[col.key] = v if v is None or col.scale == 1 else quantum.from_units(v, col.scale)
    if shape.throttle is None:
        out["throttle_s"] = None
    else:
        other = (row.get("extra") or {}).get("throttle_s", {})
        throttle = {}
        for reason in shape.throttle:
            ms = other[reason] if reason in other else row[f"thr_{reason}"] or 0
            throttle[reason] = quantum.from_units(ms, quantum.THROTTLE_SCALE)
        out["throttle_s"] = throttle
    return {k: out[k] for k in GPU_ROW_KEYS}


def encode_host(row: Mapping[str, Any], run_key: int) -> dict[str, Any]:
    _check_keys(row, HOST_ROW_KEYS, "host interval")
    seq = _units(row["seq"], 1, "seq")
    day, t_ms, dur = split_time(row["t0"], row["t1"], f"host interval seq={seq}")
    out: dict[str, Any] = {"run": run_key, "seq": seq, "t_ms": t_ms, "dur_ms": dur, "day": day}
    types = dict(HOST_COLUMNS)
    for name, (key, scale) in _HOST_MAP.items():
        value = row[key]
        if value is None:
            if name in HOST_NOT_NULL:
                raise ValueError(f"host interval seq={seq}: {key} may not be None")
            out[name] = None
            continue
        u = out[name] = _units(value, scale, key)
        bits = 63 if types[name] == "int8" else 31
        if not -(2**bits) <= u < 2**bits:
            raise ValueError(f"host interval seq={seq}: {key}={value!r} does not fit {types[name]}")
    if not INT4[0] <= seq <= INT4[1]:
        raise ValueError(f"seq={seq} does not fit int4")
    return out


def decode_host(row: Mapping[str, Any]) -> dict[str, Any]:
    t0 = row["day"] * DAY_MS + row["t_ms"]
    out: dict[str, Any] = {"seq": row["seq"], "t0": t0 / 1000, "t1": (t0 + row["dur_ms"]) / 1000}
    for name, (key, scale) in _HOST_MAP.items():
        v = row[name]
        out[key] = v if v is None or scale == 1 else quantum.from_units(v, scale)
    return {k: out[k] for k in HOST_ROW_KEYS}
