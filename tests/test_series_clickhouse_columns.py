"""The ClickHouse store's column-wise conversion (series/clickhouse_columns.py) gives the integers
the row-by-row conversion (clickhouse_rows.gpu_row) gives, for any ledger values: plain floats,
ints, None, NaN, negative readings, odd types and values out of range (which fall back to the row
path and are refused by it with the row named)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.series.clickhouse_columns import gpu_columns
from gpuledger.series.clickhouse_rows import GPU_INSERT, GPU_VALUES, BadRow, gpu_row

GPUS = {"GPU-a": 11, "GPU-b": 12}
_value = st.one_of(
    st.none(),
    st.floats(allow_infinity=False, min_value=-1e12, max_value=1e12),
    st.sampled_from([math.nan, math.inf, 1e30, "12", "twelve"]),
    st.integers(-(10**12), 10**12),
    st.floats(min_value=0, max_value=1e4).map(lambda x: round(x, 3)),
    st.just(True),
)


@st.composite
def batches(draw: st.DrawFn) -> list[dict[str, Any]]:
    rows = []
    for seq in range(draw(st.integers(1, 20))):
        t0 = draw(st.integers(0, 2 * 10**12)) / 1000
        row: dict[str, Any] = {
            "device_uuid": draw(st.sampled_from(sorted(GPUS))), "seq": seq, "t0": t0,
            "t1": t0 + draw(st.sampled_from([0.0, 0.001, 5.0, 60.5])),
            "util_method": draw(st.sampled_from([None, "samples"])), "energy_method": "counter", "proc_method": None,
            "throttle_s": draw(st.one_of(st.none(), st.dictionaries(st.sampled_from(["power", "thermal"]),
                                                                    st.floats(0, 60).map(lambda x: round(x, 4))))),
        }  # fmt: skip
        for col in GPU_VALUES:
            row[col] = draw(_value)
        row["samples"] = draw(st.one_of(st.integers(0, 500), _value))
        rows.append(row)
    return rows


def _row_path(rows: list[dict[str, Any]]) -> dict[str, list[Any]] | str:
    try:
        conv = [gpu_row(r, GPUS[r["device_uuid"]], 7, f"run r GPU {r['device_uuid']} seq {r['seq']}") for r in rows]
    except BadRow as e:
        return str(e)
    return {c: [r[c] for r in conv] for c in GPU_INSERT}


@settings(max_examples=150, deadline=None)
@given(rows=batches())
def test_columns_equal_the_row_path(rows: list[dict[str, Any]]) -> None:
    want = _row_path(rows)
    try:
        got: dict[str, list[Any]] | str = gpu_columns(rows, GPUS, 7, "r")
    except BadRow as e:
        got = str(e)
    assert got == want


def test_plain_batch_is_vectorised_and_exact() -> None:
    """Values whose product sits on a rounding edge: the same half-away-from-zero integers."""
    rows = [
        {"device_uuid": "GPU-a", "seq": i, "t0": 1_780_000_000.0 + 5 * i, "t1": 1_780_000_005.0 + 5 * i,
         "samples": 30, "busy_s": b, "util_idle_s": None, "energy_j": math.nan, "power_max_w": -0.0005,
         "temp_max_c": 45.05, "throttle_s": {"power": 0.0015}}
        for i, b in enumerate([0.0005, 1.0015, 2.5, 4.9995, 0.1 + 0.2])
    ]  # fmt: skip
    cols = gpu_columns(rows, GPUS, 7, "r")
    assert cols == _row_path(rows)
    assert cols["busy_ms"] == [1, 1002, 2500, 5000, 300] and cols["energy_mj"] == [None] * 5
    assert cols["idle_ms"] == [None] * 5 and cols["power_max_mw"] == [-1] * 5


@pytest.mark.parametrize(
    "bad, what",
    [({"busy_s": -1.0}, "busy_s"), ({"samples": None}, "samples"), ({"energy_j": "twelve"}, "energy_j"),
     ({"t1": 1.0}, "duration"), ({"seq": -1}, "seq"), ({"throttle_s": {"power": -1.0}}, "power")],
)  # fmt: skip
def test_bad_value_is_refused_by_name(bad: dict[str, Any], what: str) -> None:
    rows = [{"device_uuid": "GPU-a", "seq": 0, "t0": 100.0, "t1": 105.0, "samples": 30, "busy_s": 1.0}]
    rows.append({**rows[0], "seq": 1, **bad})
    with pytest.raises(BadRow, match=what) as e:
        gpu_columns(rows, GPUS, 7, "r")
    assert "seq" in str(e.value)
