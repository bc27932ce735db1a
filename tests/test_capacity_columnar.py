"""The column-wise hours of the capacity report (core/capacity/columnar.py) are, cell by cell, the
integers the one-at-a-time rules give (core/capacity/model.to_uh, money.joules_to_mwh): property tests."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.core.capacity.columnar import cells_to_uh, sums_by_slot
from gpuledger.core.capacity.model import DAY_MS, to_uh
from gpuledger.core.money import joules_to_mwh

cell = st.lists(st.integers(0, DAY_MS // 5), min_size=5, max_size=5)


@given(st.lists(st.tuples(cell, st.integers(0, 100), st.none() | st.floats(0, 1e9, allow_nan=False)), min_size=1,
                max_size=40))  # fmt: skip
def test_columnwise_hours_equal_the_cell_by_cell_rule(cells: list) -> None:
    parts = np.array([c[0] for c in cells], dtype=np.int64)
    unmeasured = np.array([sum(c[0]) * c[1] // 100 for c in cells], dtype=np.int64)
    energy = np.array([c[2] or 0.0 for c in cells])
    seen = np.array([c[2] is not None for c in cells])
    uh, unmeasured_uh, mwh = cells_to_uh(parts, unmeasured, energy, seen)
    for i, (p, _, e) in enumerate(cells):
        assert list(uh[i]) == to_uh(p)
        m = int(unmeasured[i])
        assert unmeasured_uh[i] == (to_uh([m, sum(p) - m])[0] if m else 0)
        assert mwh[i] == (joules_to_mwh(e) if e is not None else 0)


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10**12)), min_size=1, max_size=60))
def test_sums_by_slot_are_exact(rows: list) -> None:
    slots = np.array([r[0] for r in rows], dtype=np.int64)
    values = np.array([r[1] for r in rows], dtype=np.int64)
    expected: dict[int, int] = {}
    for s, v in rows:
        expected[s] = expected.get(s, 0) + v
    assert {k: v[0] for k, v in sums_by_slot(slots, [values]).items()} == expected
