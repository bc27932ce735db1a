"""The capacity report's cells turned into micro-GPU-hours column-wise (numpy), for a year of a large
fleet: the same integers, cell by cell, as core/capacity/model.to_uh and money.joules_to_mwh give one at a
time (tests/test_capacity_columnar.py checks it), then summed per slot (group and price line) in
int64. Pure.

Bounds: a cell is at most a day (86,400,000 ms, 24,000,000 µh), so ms x µh < 2.1e15 and the sums of
a year of 100,000 GPUs stay far below 2^63.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpuledger.core.capacity.model import uh_of
from gpuledger.core.money import MWH_PER_J

__all__ = ["cells_to_uh", "sums_by_slot"]


def cells_to_uh(
    parts_ms: np.ndarray, unmeasured_ms: np.ndarray, energy_j: np.ndarray, energy_seen: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(µh of each part, N x k; unmeasured µh, N; energy mWh, N) of N cells of k parts each."""
    span = parts_ms.sum(axis=1)
    total = uh_of(span)  # integer arithmetic: works on int64 columns as on one int
    safe = np.where(span > 0, span, 1)
    scaled = parts_ms * total[:, None]
    floors = scaled // safe[:, None]
    left = total - floors.sum(axis=1)
    remainders = scaled % safe[:, None]
    # one each to the largest remainders, ties to the earlier part: a stable sort of -remainder
    order = np.argsort(-remainders, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(parts_ms.shape[1])[None, :].repeat(len(order), axis=0), axis=1)
    uh = floors + (rank < left[:, None])
    # unmeasured: the first of two parts [unmeasured, the rest] of the same total
    rest = span - unmeasured_ms
    q1, q2 = unmeasured_ms * total, rest * total
    f1 = q1 // safe
    gets_left = (total - f1 - q2 // safe == 1) & (q1 % safe >= q2 % safe)
    unmeasured_uh = np.where(unmeasured_ms > 0, f1 + gets_left, 0)
    mwh = np.where(energy_seen, np.rint(energy_j * MWH_PER_J), 0).astype(np.int64)
    return uh, unmeasured_uh, mwh


def sums_by_slot(slots: np.ndarray, columns: Sequence[np.ndarray]) -> dict[int, list[int]]:
    """Each slot's column sums, exact (int64), as Python ints."""
    if not len(slots):
        return {}
    order = np.argsort(slots, kind="stable")
    ordered = slots[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    sums = [np.add.reduceat(col[order], starts) for col in columns]
    return {int(ordered[s]): [int(col[i]) for col in sums] for i, s in enumerate(starts)}
