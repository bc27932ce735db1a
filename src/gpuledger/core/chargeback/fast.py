"""The columnar path of a chargeback: the common rollup rows priced and summed with numpy.

Most rollup rows of a report's window are plain: a whole GPU, a price and a month that hold all
day, busy time measured, no shared-GPU rule, no flag. ``Pricer.price_rollups`` would turn each into
a vector of Python integers and the report would add those up one by one; for a year of a large
cluster that is most of the report's time. Here the same integers are computed for all such rows at
once and summed per (group, price context), exactly: every quantity is the same ``round()`` of the
same float product as in cost.py (numpy's ``rint`` rounds half to even like ``round``), sums of
integers are done in int64 (a year of 10,000 GPUs stays far below 2**63), and money, which is
linear in those integers, is computed from the sums with Python integers. Only the ranking of
single runs by cost uses floats, to pick candidates whose exact figures are then computed.

The rows it does not take (everything unusual) go back to the caller for the exact per-row path.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuledger.core.money import MWH_PER_J, UH_PER_S
from gpuledger.core.pricing.cost import Pricer, measured_amounts

__all__ = ["FastPart", "price_plain_rows"]


@dataclass
class FastPart:
    """What the columnar path contributes to a chargeback (all inside the report's window).

    ``cells``: (group key, month) -> AMOUNTS vector; ``members``: group key -> run ids;
    ``users``: user -> (AMOUNTS vector, list of run ids). Group keys are the run's key values,
    or with a per-piece key (gpu_model / instance_type in ``by``) (run key values, model,
    instance) as build_from_compact makes them. ``run_ids``: every run of the report (empty when
    no row was plain), in the order of the report's runs: rows refer to runs by position."""

    cells: dict[tuple[Any, str], list[int]] = field(default_factory=dict)
    members: dict[tuple[Any, ...], set[str]] = field(default_factory=dict)
    users: dict[str, tuple[list[int], list[str]]] = field(default_factory=dict)
    run_ids: list[str] = field(default_factory=list)
    # Per row: run code (index into run_ids), context code, and the integer quantities.
    _run: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _ctx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _alloc: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _busy: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _units: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _contexts: list[tuple[Any, ...]] = field(default_factory=list)  # (model, instance, month, terms, flags)
    _position: dict[str, int] = field(default_factory=dict)  # run id -> its index in run_ids
    _ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))  # run_ids as an array

    def context_flags(self) -> list[tuple[str, str | None, tuple[str, ...]]]:
        """(model, instance type, flags) of each price context some row was priced in."""
        used = np.unique(self._ctx).tolist() if len(self._ctx) else []
        return [(self._contexts[i][0], self._contexts[i][1], self._contexts[i][4]) for i in used]

    def approx(self, index: int) -> np.ndarray:
        """Float estimates of cost (``index`` 5) or idle cost (6) per run of ``run_ids``, for ranking."""
        rate = np.array([c[3][0] for c in self._contexts], dtype=np.float64)
        if index == 5:
            energy_u = np.array([c[3][2] for c in self._contexts], dtype=np.float64)
            by_alloc = np.array([c[3][4] for c in self._contexts], dtype=bool)
            billed = np.where(by_alloc[self._ctx], self._alloc, self._busy).astype(np.float64)
            amount = billed * rate[self._ctx] + self._units.astype(np.float64) * energy_u[self._ctx]
        else:
            amount = (self._alloc - self._busy).astype(np.float64) * rate[self._ctx]
        return np.bincount(self._run, weights=amount, minlength=len(self.run_ids))

    def near_top(self, index: int, n: int, others: Mapping[str, float], logical_of: Mapping[str, str]) -> set[str]:
        """Logical runs that may be among the ``n`` largest by cost (5) or idle cost (6): this
        part's runs summed into their logical run (``logical_of``: attempt -> first attempt),
        plus the estimates of ``others`` (logical run -> value, from the per-row path). Chosen
        with a margin far above the estimates' rounding error, ties included; only values > 0."""
        values = self.approx(index)
        ids = self._ids
        # Runs whose logical total gathers more than their own rows go through a dict (few).
        joined = set(logical_of) | set(logical_of.values()) | set(others)
        mixed = np.zeros(len(self.run_ids), dtype=bool)
        mixed[[self._position[r] for r in joined if r in self._position]] = True
        totals = dict(others)
        for i in np.flatnonzero(mixed).tolist():
            rid = self.run_ids[i]
            logical = logical_of.get(rid, rid)
            totals[logical] = totals.get(logical, 0.0) + float(values[i])
        single_values, single_ids = values[~mixed], ids[~mixed]
        pool = np.concatenate([single_values, np.fromiter(totals.values(), dtype=np.float64, count=len(totals))])
        if len(pool) > n:
            nth = float(np.partition(pool, len(pool) - n)[len(pool) - n])
            floor = max(nth - abs(nth) * 1e-9 - 1.0, 0.0)
        else:
            floor = 0.0
        out = set(single_ids[(single_values >= floor) & (single_values > 0)].tolist())
        out.update(k for k, v in totals.items() if v >= floor and v > 0)
        return out

    def exact(self, run_ids: Iterable[str]) -> dict[str, tuple[list[int], set[str], set[str]]]:
        """Exact AMOUNTS vectors, GPU models and flags of ``run_ids`` (those with plain rows)."""
        wanted = {self._position[r] for r in run_ids if r in self._position}
        if not wanted:
            return {}
        rows = np.flatnonzero(np.isin(self._run, np.fromiter(wanted, np.int64)))
        out: dict[str, tuple[list[int], set[str], set[str]]] = {}
        for i in rows.tolist():
            rid = self.run_ids[int(self._run[i])]
            model, _, _, terms, flags = self._contexts[int(self._ctx[i])]
            v = _vector(int(self._alloc[i]), int(self._busy[i]), int(self._units[i]), terms)
            acc = out.get(rid)
            if acc is None:
                out[rid] = (v, {model}, set(flags))
            else:
                acc[0][:] = [a + b for a, b in zip(acc[0], v, strict=True)]
                acc[1].add(model)
                acc[2].update(flags)
        return out


def _vector(alloc: int, busy: int, units: int, terms: tuple[int, int, int, int, bool]) -> list[int]:
    return list(measured_amounts(alloc, busy, units, terms))


def _sum_by(codes: np.ndarray, *columns: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Exact int64 sums of ``columns`` per distinct code: (codes, sums per column)."""
    order = np.argsort(codes)  # any order within a code: the sums are of integers
    ordered = codes[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    return ordered[starts], [np.add.reduceat(c[order], starts) for c in columns]


def _codes(column: Sequence[Any]) -> tuple[list[Any], np.ndarray]:
    """(distinct values in first-seen order, the code of each element): dict work done in C."""
    distinct = list(dict.fromkeys(column))
    index = {value: i for i, value in enumerate(distinct)}
    return distinct, np.fromiter(map(index.__getitem__, column), dtype=np.int64, count=len(column))


def price_plain_rows(
    rows: Sequence[tuple[Any, ...]],
    runs: Mapping[str, Any],
    pricer: Pricer,
    period_of_day: Mapping[int, int],
    periods: Sequence[tuple[float, bool]],
    *,
    start: float,
    end: float,
    run_keys: Sequence[str],
    by_model: bool,
    by_instance: bool,
) -> tuple[FastPart, list[tuple[Any, ...]]]:
    """Price the plain rollup rows of [start, end) (cost_queries.rollup_days rows; those of runs
    not in ``runs`` are skipped) columnwise; return the FastPart and the rows left for the
    per-row path."""
    if not rows:
        return FastPart(), []
    n = len(rows)
    run_col, day_col, name_col, profile_col, t0_col, t1_col, alloc_col, busy_col, energy_col, rule_col, inst_col = zip(
        *rows, strict=True
    )
    # One pass of dict look-ups over the rows' run ids (each is a cache miss in a large dict):
    # the code of a row's run is its position in ``runs``, -1 for a run not there.
    run_ids = list(runs)
    position = dict(zip(run_ids, range(len(run_ids)), strict=True))
    run_codes = np.fromiter(map(position.get, run_col, itertools.repeat(-1)), dtype=np.int64, count=n)
    known = run_codes >= 0
    busy_s = np.array(busy_col, dtype=np.float64)  # None -> nan
    plain = known & ~np.isnan(busy_s)
    t0, t1 = np.array(t0_col, dtype=np.float64), np.array(t1_col, dtype=np.float64)
    plain &= (t0 >= start) & (t1 <= end) & (t1 > start) & (t0 < end)  # as price_rollups: none at an edge
    if any(rule_col):
        plain &= np.fromiter(map(operator.not_, rule_col), dtype=bool, count=n)
    period_col = list(map(period_of_day.__getitem__, day_col))
    keys, key_codes = _codes(list(zip(name_col, profile_col, inst_col, period_col, strict=True)))
    contexts: list[tuple[Any, ...]] = []
    ctx_of_key = np.array([_context_code(pricer, key, periods, contexts) for key in keys], dtype=np.int64)
    row_ctx = ctx_of_key[key_codes]
    plain &= row_ctx >= 0
    slow = [rows[i] for i in np.flatnonzero(known & ~plain).tolist()]
    take = np.flatnonzero(plain)
    if not len(take):
        return FastPart(_contexts=contexts), slow
    part = FastPart(run_ids=run_ids, _contexts=contexts, _position=position)
    part._run = run_codes[take]
    part._ctx = row_ctx[take]
    # The same float operations, in the same order, as Pricer.price_rollups (share is 1: whole GPUs).
    part._alloc = np.rint(np.array(alloc_col, dtype=np.float64)[take] * UH_PER_S).astype(np.int64)
    part._busy = np.minimum(part._alloc, np.rint(busy_s[take] * UH_PER_S).astype(np.int64))
    energy = np.array(energy_col, dtype=np.float64)[take]
    mwh = np.rint(np.nan_to_num(energy * MWH_PER_J, nan=0.0)).astype(np.int64)
    pue_m = np.array([c[3][1] for c in contexts], dtype=np.int64)
    part._units = mwh * pue_m[part._ctx]
    _sum_groups(part, runs, run_keys, by_model, by_instance)
    return part, slow


def _context_code(
    pricer: Pricer, key: tuple[Any, ...], periods: Sequence[tuple[float, bool]], contexts: list[tuple[Any, ...]]
) -> int:
    """The index of a plain price context in ``contexts`` (model, instance, month, terms, flags),
    or -1 when rows of this GPU kind and period need the per-row path."""
    name, profile, instance, period = key
    at, uniform = periods[period]
    if not uniform or profile:
        return -1
    model, _share, _factor, flags, _line, month, terms = pricer._context(name or None, None, instance, at)
    if terms is None:
        return -1
    contexts.append((model, instance, month, terms, flags))
    return len(contexts) - 1


def _groups_of(codes: np.ndarray, ids: np.ndarray) -> dict[int, list[str]]:
    """code -> the list of ``ids`` (an object array) at the positions holding it."""
    order = np.argsort(codes)
    ordered = codes[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]).tolist()
    bounds = [*starts, len(ordered)]
    return {int(ordered[a]): ids[order[a:b]].tolist() for a, b in itertools.pairwise(bounds)}


def _sets_by(codes: np.ndarray, ids: np.ndarray) -> dict[int, set[str]]:
    """code -> the set of ``ids`` (an object array) at the positions holding it."""
    return {code: set(members) for code, members in _groups_of(codes, ids).items()}


def _sum_groups(
    part: FastPart, runs: Mapping[str, Any], run_keys: Sequence[str], by_model: bool, by_instance: bool
) -> None:
    """Fill ``cells``, ``members`` and ``users`` of ``part`` from its rows."""
    per_line = by_model or by_instance
    infos = list(runs.values())  # in the order of part.run_ids
    if run_keys:
        get = operator.attrgetter(*run_keys)
        values = list(map(get, infos)) if len(run_keys) > 1 else [(v,) for v in map(get, infos)]
    else:
        values = [()] * len(infos)
    keys, run_key = _codes(values)
    users, run_user = _codes(list(map(operator.attrgetter("user"), infos)))
    ids = part._ids = np.array(part.run_ids, dtype=object)
    priced = np.flatnonzero(np.bincount(part._run, minlength=len(infos)))  # the runs with plain rows
    n_ctx = len(part._contexts)
    quantities = (part._alloc, part._busy, part._units)

    def vectors(codes: np.ndarray) -> dict[int, list[int]]:
        """Exact AMOUNTS vectors per group code, from sums per (group, context)."""
        found, sums = _sum_by(codes * n_ctx + part._ctx, *quantities)
        out: dict[int, list[int]] = {}
        for code, alloc, busy, units in zip(found.tolist(), *(s.tolist() for s in sums), strict=True):
            group, ctx = divmod(code, n_ctx)
            v = _vector(alloc, busy, units, part._contexts[ctx][3])
            acc = out.get(group)
            out[group] = v if acc is None else [a + b for a, b in zip(acc, v, strict=True)]
        return out

    # Cells: (group key, month). The month and, per line, the model and instance come from the context.
    line_of = [(c[0] if by_model else None, c[1] if by_instance else None) for c in part._contexts]
    cell_parts, ctx_cell = _codes([(*line, c[2]) for line, c in zip(line_of, part._contexts, strict=True)])
    n_cells = len(cell_parts)
    row_key = run_key[part._run]
    for code, v in vectors(row_key * n_cells + ctx_cell[part._ctx]).items():
        kc, cc = divmod(code, n_cells)
        model, instance, month = cell_parts[cc]
        group = (keys[kc], model, instance) if per_line else keys[kc]
        acc = part.cells.get((group, month))
        part.cells[(group, month)] = v if acc is None else [a + b for a, b in zip(acc, v, strict=True)]
    # Members: the runs with a piece in each group.
    if per_line:
        lines, ctx_line = _codes(line_of)
        group_line = row_key * len(lines) + ctx_line[part._ctx]
        for code, members in _sets_by(group_line, ids[part._run]).items():
            kc, lc = divmod(code, len(lines))
            part.members[(keys[kc], *lines[lc])] = members
    else:
        part.members = {keys[kc]: members for kc, members in _sets_by(run_key[priced], ids[priced]).items()}
    # Users: their summed vectors and their runs.
    user_vectors = vectors(run_user[part._run])
    by_user = _groups_of(run_user[priced], ids[priced])
    part.users = {users[uc]: (user_vectors[uc], members) for uc, members in by_user.items()}
