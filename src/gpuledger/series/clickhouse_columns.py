"""A batch of ledger GPU rows as the ClickHouse insert's columns, converted column by column with
numpy (docs/SCALE.md, step 5): the same integers as clickhouse_rows.gpu_row, row by row, gives
(tests/test_series_clickhouse_columns.py), for a fraction of its cost per row (about 35 us).

Only the plain case is vectorised: every value of a column a float, an int or None. A column with
anything else, a value out of its column's range or a bad time falls back to gpu_row for the
whole batch, which refuses the bad row by name, so errors read exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gpuledger.series.clickhouse_rows import GPU_INSERT, GPU_TEXT, GPU_VALUES, gpu_row

_PLAIN = (float, int)
_I64 = 2**63 - 1
_U32 = 2**32 - 1


class _Fallback(Exception):
    """Not the plain case: convert row by row."""


def _units(values: list[Any], scale: int, lo: int, hi: int) -> list[int | None]:
    """quantum.to_units of each value (None and NaN stay None): the float product rounded half
    away from zero, exactly as the row path computes it."""
    if any(type(v) not in _PLAIN for v in values if v is not None):
        raise _Fallback
    x = np.array([np.nan if v is None else v for v in values], dtype=np.float64) * scale
    missing = np.isnan(x)
    ok = missing | ((x >= lo) & (x <= hi))
    if not ok.all():
        raise _Fallback
    x = np.where(missing, 0.0, x)
    units = np.where(x >= 0, np.floor(x + 0.5), -np.floor(-x + 0.5)).astype(np.int64).tolist()
    if not missing.any():
        return units
    return [None if m else u for u, m in zip(units, missing.tolist(), strict=True)]


def _convert(rows: Sequence[Mapping[str, Any]], gpus: Mapping[str, int], run: int) -> dict[str, list[Any]]:
    cols: dict[str, list[Any]] = {}
    t0 = _units([r.get("t0") for r in rows], 1000, 0, _I64)
    t1 = _units([r.get("t1") for r in rows], 1000, 0, _I64)
    if None in t0 or None in t1:
        raise _Fallback
    dur = [b - a for a, b in zip(t0, t1, strict=True)]  # type: ignore[operator]
    if not all(0 <= d <= _U32 for d in dur):
        raise _Fallback
    seq = [r.get("seq") for r in rows]
    if not all(type(s) is int and 0 <= s <= _U32 for s in seq):
        raise _Fallback
    cols["gpu"] = [gpus[r["device_uuid"]] for r in rows]
    cols["t0"] = [f"{a // 1000}.{a % 1000:03d}" for a in t0]  # type: ignore[operator]
    cols["dur_ms"] = dur
    cols["run"] = [run] * len(rows)
    cols["seq"] = seq
    for col, (name, scale, lo, hi) in GPU_VALUES.items():
        cols[name] = _units([r.get(col) for r in rows], scale, lo, hi)
    if None in cols["samples"]:
        raise _Fallback
    for col in GPU_TEXT:
        cols[col] = [r.get(col) for r in rows]
        if any(v is not None and type(v) is not str for v in cols[col]):
            raise _Fallback
    throttle_ms, read = [], []
    for r in rows:
        t = r.get("throttle_s")
        if t is None:
            throttle_ms.append({})
            read.append(False)
            continue
        if type(t) is not dict:
            raise _Fallback
        ms = {}
        for reason, v in t.items():
            if type(reason) is not str or type(v) not in _PLAIN or not 0 <= (x := v * 1000) <= _U32:
                raise _Fallback
            ms[reason] = int(x + 0.5)
        throttle_ms.append(ms)
        read.append(True)
    cols["throttle_ms"], cols["throttle_read"] = throttle_ms, read
    return cols


def gpu_columns(
    rows: Sequence[Mapping[str, Any]], gpus: Mapping[str, int], run: int, run_id: str
) -> dict[str, list[Any]]:
    """The batch as {column: values} in GPU_INSERT's order. Raises BadRow as gpu_row does."""
    try:
        return _convert(rows, gpus, run)
    except _Fallback:
        converted = [
            gpu_row(r, gpus[r["device_uuid"]], run, f"run {run_id} GPU {r['device_uuid']} seq {r.get('seq')}")
            for r in rows
        ]
        return {c: [r[c] for r in converted] for c in GPU_INSERT}
