"""Interval rows on the wire, compact form: one JSON array per interval, columns in a fixed order.

``gpu_rows`` / ``host_rows`` carry the same fields as ``gpu_intervals`` / ``host_intervals``
(objects) in the order of GPU_COLUMNS / HOST_COLUMNS, ``null`` where not measured. It is the
agents' format: half the bytes, and it is validated straight into tuples that go to PostgreSQL's
COPY as they are. Both forms may be mixed in one batch. ``row_problems`` adds what the per-field
limits cannot see: t1 >= t0, interval length, busy time and energy within the interval, and no
timestamp far in the future.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from gpuledger.core.wire import GPU_COLUMNS, GPU_COLUMNS_V1, GPU_COLUMNS_V2, HOST_COLUMNS
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

# The type of each GPU_COLUMNS entry, in order; an older agent's row is a prefix of it.
_GPU_TYPES = (
    Short, Seq, T, T, Count, NonNeg | None, Short | None, Pct | None, NonNeg | None, Short | None, Watts | None,
    Bytes | None, Bytes | None, Bytes | None, Bytes | None, Pct | None, Celsius | None, NonNeg | None, NonNeg | None,
    dict[Short, NonNeg] | None, NonNeg | None, NonNeg | None, Short | None, NonNeg | None,
)  # fmt: skip
assert len(_GPU_TYPES) == len(GPU_COLUMNS)
_GpuRowV1 = tuple[_GPU_TYPES[: len(GPU_COLUMNS_V1)]]  # type: ignore[valid-type]
_GpuRowV2 = tuple[_GPU_TYPES[: len(GPU_COLUMNS_V2)]]  # type: ignore[valid-type]
_GpuRowV3 = tuple[_GPU_TYPES]  # type: ignore[valid-type]


def _full_width(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A row from an agent that predates the later columns, padded with "not measured"."""
    return row if len(row) == len(GPU_COLUMNS) else (*row, *(None,) * (len(GPU_COLUMNS) - len(row)))


# Every width is accepted (agents upgrade after the server); every row leaves validation full width.
# The widths differ, so at most one matches: tried left to right (the current width first), not in
# pydantic's "smart" mode, which tries each strictly and then laxly: 2.5x the work on a 96-row push,
# the same rows and the same errors.
GpuRow = Annotated[_GpuRowV3 | _GpuRowV2 | _GpuRowV1, Field(union_mode="left_to_right"), AfterValidator(_full_width)]
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


def row_problems(rows: Sequence[Sequence[Any]], series: str, now: float) -> dict[int, str]:
    """Cross-field problems of GPU (``series`` "gpu") or host rows: index -> what is wrong, for
    every bad row (partial acceptance quarantines each one)."""
    gpu = series == "gpu"
    t0_at, t1_at = (G_T0, G_T1) if gpu else (H_T0, H_T1)
    max_t = now + FUTURE_SKEW_S
    problems: dict[int, str] = {}
    for i, r in enumerate(rows):
        t0, t1 = r[t0_at], r[t1_at]
        span = t1 - t0
        msg = None
        if span < 0:
            msg = f"t1 ({t1}) is before t0 ({t0})"
        elif span > MAX_INTERVAL_S:
            msg = f"an interval of {span:.0f} s is longer than {MAX_INTERVAL_S:.0f} s"
        elif t1 > max_t:
            msg = f"t1 ({t1}) is in the future (server clock {now:.0f})"
        elif gpu and r[G_BUSY] is not None and r[G_BUSY] > 2 * span + 5:
            msg = f"busy_s {r[G_BUSY]} exceeds the interval's {span:.3f} s"
        elif gpu and r[G_ENERGY] is not None and r[G_ENERGY] > MAX_WATTS * (span + 5):
            msg = f"energy_j {r[G_ENERGY]} is more than {MAX_WATTS:.0f} W over the interval"
        if msg is not None:
            problems[i] = msg
    return problems
