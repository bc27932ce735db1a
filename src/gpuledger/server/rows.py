"""Interval rows on the wire, compact form: one JSON array per interval, columns in a fixed order.

``gpu_rows`` / ``host_rows`` carry the same fields as ``gpu_intervals`` / ``host_intervals``
(objects) in the order of GPU_COLUMNS / HOST_COLUMNS, ``null`` where not measured. It is the
agents' format: half the bytes, and it is validated straight into tuples that go to PostgreSQL's
COPY as they are. Both forms may be mixed in one batch. ``check_rows`` adds what the per-field
limits cannot see: t1 >= t0, interval length, busy time and energy within the interval, and no
timestamp far in the future.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuledger.core.wire import GPU_COLUMNS, HOST_COLUMNS
from gpuledger.server.wire_types import (
    FUTURE_SKEW_S,
    MAX_INTERVAL_S,
    MAX_WATTS,
    Bytes,
    Celsius,
    Count,
    NonNeg,
    Pct,
    Seq,
    Short,
    T,
    Watts,
)

GpuRow = tuple[
    Short, Seq, T, T, Count, NonNeg | None, Short | None, Pct | None, NonNeg | None, Short | None, Watts | None,
    Bytes | None, Bytes | None, Bytes | None, Bytes | None, Pct | None, Celsius | None, NonNeg | None, NonNeg | None,
    dict[Short, NonNeg] | None,
]  # fmt: skip
HostRow = tuple[
    Seq, T, T, Count, NonNeg, Bytes, Bytes, Bytes, Count, Count, Pct | None, NonNeg | None, Bytes | None,
    Bytes | None, Bytes | None, Bytes | None, Bytes | None,
]  # fmt: skip

GPU_DEFAULTS: dict[str, Any] = {"samples": 0}
HOST_DEFAULTS: dict[str, Any] = {
    "samples": 0, "cpu_s": 0.0, "rss_max_b": 0, "read_b": 0, "write_b": 0, "threads_max": 0, "procs_max": 0,
}  # fmt: skip
# Positions used by the checks and the bulk insert.
G_UUID, G_SEQ, G_T0, G_T1, G_BUSY, G_ENERGY = 0, 1, 2, 3, 5, 8
H_SEQ, H_T0, H_T1 = 0, 1, 2


def gpu_tuple(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(row.get(c, GPU_DEFAULTS.get(c)) for c in GPU_COLUMNS)


def host_tuple(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(row.get(c, HOST_DEFAULTS.get(c)) for c in HOST_COLUMNS)


def check_rows(
    gpu: Sequence[Sequence[Any]], host: Sequence[Sequence[Any]], now: float, where: tuple[str, str]
) -> list[dict[str, Any]]:
    """Cross-field errors in pydantic's shape (loc, msg, type); ``where`` names the two lists."""
    errors: list[dict[str, Any]] = []
    max_t = now + FUTURE_SKEW_S

    def bad(kind: str, i: int, msg: str) -> None:
        if len(errors) < 20:
            errors.append({"loc": ["body", kind, i], "msg": msg, "type": "value_error"})

    for kind, rows, t0_at, t1_at, busy_at, energy_at in (
        (where[0], gpu, G_T0, G_T1, G_BUSY, G_ENERGY),
        (where[1], host, H_T0, H_T1, None, None),
    ):
        for i, r in enumerate(rows):
            t0, t1 = r[t0_at], r[t1_at]
            span = t1 - t0
            if span < 0:
                bad(kind, i, f"t1 ({t1}) is before t0 ({t0})")
            elif span > MAX_INTERVAL_S:
                bad(kind, i, f"an interval of {span:.0f} s is longer than {MAX_INTERVAL_S:.0f} s")
            if t1 > max_t:
                bad(kind, i, f"t1 ({t1}) is in the future (server clock {now:.0f})")
            if busy_at is not None and r[busy_at] is not None and r[busy_at] > 2 * span + 5:
                bad(kind, i, f"busy_s {r[busy_at]} exceeds the interval's {span:.3f} s")
            if energy_at is not None and r[energy_at] is not None and r[energy_at] > MAX_WATTS * (span + 5):
                bad(kind, i, f"energy_j {r[energy_at]} is more than {MAX_WATTS:.0f} W over the interval")
    return errors
