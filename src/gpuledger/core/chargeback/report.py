"""Chargeback: priced lines summed by group, with the top spenders, the monthly trend and anomalies.

Pure. Sums are integers (money.py), so the groups add up exactly to the total. Output rows follow
``chargeback_columns.COLUMNS`` (names, order, units): hours and ratios as floats rounded to 6
places, money as exact decimal strings.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpuledger.core.chargeback.columns import GROUP_KEYS
from gpuledger.core.chargeback.fast import FastPart
from gpuledger.core.chargeback.sections import anomalies, chains, top_runs, top_users, trend_rows, warnings
from gpuledger.core.chargeback.totals import RunInfo, Totals, as_set, share, sort_key, usage_columns
from gpuledger.core.model import DISCOVERED
from gpuledger.core.money import money_decimal
from gpuledger.core.pricing.cost import Compact, CostLine, compact
from gpuledger.core.pricing.usage import PARTIAL_STATUSES, partial_flag

__all__ = ["Chargeback", "RunInfo", "Totals", "build_chargeback", "build_from_compact", "grouping", "usage_columns"]


@dataclass
class Chargeback:
    """Everything a chargeback report shows; every row is JSON-ready (see COLUMNS)."""

    params: dict[str, Any]
    groups: list[dict[str, Any]]
    total: dict[str, Any]
    top_runs_by_cost: list[dict[str, Any]]
    top_runs_by_idle_cost: list[dict[str, Any]]
    top_users_by_cost: list[dict[str, Any]]
    top_users_by_idle_cost: list[dict[str, Any]]
    trend: list[dict[str, Any]]  # per group and month, then per month for TOTAL
    anomalies: list[dict[str, Any]]
    warnings: list[str]
    total_units: Totals = field(repr=False, default_factory=Totals)  # exact sums, for checks

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.params,
            "groups": self.groups,
            "total": self.total,
            "top_runs_by_cost": self.top_runs_by_cost,
            "top_runs_by_idle_cost": self.top_runs_by_idle_cost,
            "top_users_by_cost": self.top_users_by_cost,
            "top_users_by_idle_cost": self.top_users_by_idle_cost,
            "trend": self.trend,
            "anomalies": self.anomalies,
            "warnings": self.warnings,
        }


_WARN_FLAGS = frozenset({"unknown_model", "no_factor", "unknown_instance", "mig_unknown", "instance_model_mismatch"})


def build_chargeback(lines: Iterable[CostLine], runs: Mapping[str, RunInfo], **kwargs: Any) -> Chargeback:
    """``build_from_compact`` for CostLines (cost.Pricer.price)."""
    return build_from_compact((compact(ln) for ln in lines), runs, **kwargs)


def grouping(by: Sequence[str]) -> tuple[list[str], bool, bool]:
    """(the run columns among ``by``, by gpu_model?, by instance_type?); ValueError for a bad key."""
    bad = [k for k in by if k not in GROUP_KEYS]
    if bad or not by:
        raise ValueError(f"group by one or more of {', '.join(GROUP_KEYS)} (got {', '.join(by) or 'nothing'})")
    return [k for k in by if k not in ("gpu_model", "instance_type")], "gpu_model" in by, "instance_type" in by


def build_from_compact(
    items: Iterable[Compact],
    runs: Mapping[str, RunInfo],
    *,
    by: Sequence[str],
    start: float,
    months: Sequence[str],
    top_n: int = 10,
    anomaly_threshold: float = 0.25,
    min_gpu_hours: float = 1.0,
    params: Mapping[str, Any] | None = None,
    trend_items: Iterable[tuple[tuple[Any, ...], str | None, str | None, str, Sequence[int]]] = (),
    fast: FastPart | None = None,
) -> Chargeback:
    """Sum priced pieces by the ``by`` keys. Pieces starting before ``start`` belong to the trend
    only (``months``: the trend's months in order, the report's own months last); so do
    ``trend_items``, (values of the run keys among ``by`` in their order, model, instance type,
    month, amounts) priced from per-group sums; ``fast``: the window's plain rollup rows, priced
    and summed columnwise (chargeback_fast.py), added to the same sums. One pass over the
    pieces fills (group, month) cells and per-run vectors; everything else is summed from those.
    ``runs`` values need the attributes of RunInfo."""
    by = tuple(by)
    run_keys, by_model, by_instance = grouping(by)
    per_line = by_model or by_instance  # the key depends on the piece, not only on the run
    key_cache: dict[str, tuple[Any, ...]] = {}  # run -> (its key values, its user)
    # (group, month, inside) -> the pieces' vectors, summed column by column at the end (in C).
    cell_pieces: dict[tuple[Any, str, bool], list[Sequence[int]]] = {}
    line_members: dict[tuple[Any, ...], set[str]] = {}  # only when the key depends on the piece
    inner_of: dict[str, Any] = {}  # run -> its inner key, or a set of them (per_line only)
    records: dict[str, Sequence[int]] = {}  # in the window, per run record
    models_of: dict[str, Any] = {}  # a model key, or a set of them for a run on several models
    flags_of: dict[str, set[str]] = {}
    warn_models: dict[str, int] = {}
    warn_flags: dict[str, set[str]] = {}
    add = operator.add
    # The loop runs once per priced piece (hundreds of thousands for a year): kept lean on purpose;
    # vectors are collected, not added, and users are summed from the runs afterwards.
    for run_id, model, instance, month, t0, v, flags in items:
        cached = key_cache.get(run_id)
        if cached is None:
            info = runs.get(run_id)
            run_key = tuple(None if info is None else getattr(info, k) for k in run_keys)
            cached = key_cache[run_id] = (run_key, "" if info is None else info.user)
        key = cached[0]
        if per_line:  # an inner key, put in ``by`` order once per group at the end
            key = (key, model if by_model else None, instance if by_instance else None)
        inside = t0 >= start
        cell = cell_pieces.get((key, month, inside))
        if cell is None:
            cell_pieces[(key, month, inside)] = [v]
        else:
            cell.append(v)
        if not inside:
            continue
        if per_line:
            seen_keys = inner_of.get(run_id)
            if seen_keys is None:
                inner_of[run_id] = key
            elif isinstance(seen_keys, set):
                seen_keys.add(key)
            elif seen_keys != key:
                inner_of[run_id] = {seen_keys, key}
        rec = records.get(run_id)
        if rec is None:
            records[run_id] = v
            models_of[run_id] = model
        else:
            records[run_id] = tuple(map(add, rec, v))
            seen = models_of[run_id]
            if isinstance(seen, set):
                seen.add(model)
            elif seen != model:
                models_of[run_id] = {seen, model}
        if flags:
            flags_of.setdefault(run_id, set()).update(flags)
            for flag in flags:
                if flag in _WARN_FLAGS:
                    warn_flags.setdefault(flag, set()).add(str(instance if flag == "unknown_instance" else model))
        if v[8]:
            warn_models[model] = warn_models.get(model, 0) + v[8]
    for run_values, model, instance, month, v in trend_items:
        key = (run_values, model if by_model else None, instance if by_instance else None) if per_line else run_values
        cell_pieces.setdefault((key, month, False), []).append(v)
    if fast is not None:
        for (key, month), v in fast.cells.items():
            cell_pieces.setdefault((key, month, True), []).append(v)
        for model, instance, flags in fast.context_flags():
            for flag in flags:
                if flag in _WARN_FLAGS:
                    warn_flags.setdefault(flag, set()).add(str(instance if flag == "unknown_instance" else model))
    cells = {ck: list(map(sum, zip(*vs, strict=True))) for ck, vs in cell_pieces.items()}
    del cell_pieces
    user_pieces: dict[str, tuple[list[Sequence[int]], list[str]]] = {}
    for run_id, rec in records.items():
        vectors, ids = user_pieces.setdefault(key_cache[run_id][1], ([], []))
        vectors.append(rec)
        ids.append(run_id)
    # user -> (summed vector, run ids: a list, maybe with repeats; counted for the top users only)
    users = {user: (list(map(sum, zip(*vs, strict=True))), ids) for user, (vs, ids) in user_pieces.items()}
    for user, (v, ids) in fast.users.items() if fast is not None else ():
        acc = users.get(user)
        users[user] = (v, ids) if acc is None else (list(map(add, acc[0], v)), [*acc[1], *ids])

    if per_line:  # inner keys -> keys in ``by`` order (one to one: both hold exactly the ``by`` values)
        order = {k: _line_key(by, *k) for k in {key for key, _, _ in cells}}
        cells = {(order[k], month, inside): v for (k, month, inside), v in cells.items()}
        for run_id, inner_keys in inner_of.items():  # a run is a member of each group it has pieces in
            for inner in inner_keys if isinstance(inner_keys, set) else (inner_keys,):
                line_members.setdefault(order[inner], set()).add(run_id)
        for inner, ids in fast.members.items() if fast is not None else ():
            line_members.setdefault(order[inner], set()).update(ids)
    groups: dict[tuple[Any, ...], Totals] = {}
    trend: dict[tuple[tuple[Any, ...], str], Totals] = {}
    trend_total: dict[str, Totals] = {}
    total = Totals()
    for (key, month, inside), v in cells.items():
        for target in (trend.setdefault((key, month), Totals()), trend_total.setdefault(month, Totals())):
            target.add_vec(v)
        if inside:
            groups.setdefault(key, Totals()).add_vec(v)
            total.add_vec(v)
    members = line_members if per_line else _members(records, {rid: c[0] for rid, c in key_cache.items()})
    if fast is not None and not per_line:
        for key, ids in fast.members.items():
            members.setdefault(key, set()).update(ids)
    # Which runs count as what, by set algebra (C speed) rather than a lookup per member.
    # Per run, in C: a year's report has half a million.
    logical_ids = list(map(_LOGICAL_ID, runs.values()))
    moved = map(operator.ne, runs, logical_ids)
    resumed = dict(itertools.compress(zip(runs, logical_ids, strict=True), moved))
    partial = set(itertools.compress(runs, map(PARTIAL_STATUSES.__contains__, map(_STATUS, runs.values()))))
    partial.update(rid for rid, r in runs.items() if r.status == DISCOVERED and r.ended_at is None)  # still open
    replayed = set(itertools.compress(runs, map(_REPLAYED, runs.values())))  # only there when asked for
    attempt_ids = set(resumed)
    for key, ids in members.items():
        g = groups[key]
        g.records = ids
        g.logical = _logical(ids, resumed, attempt_ids)
        g.partial = ids & partial
        g.replayed = ids & replayed
        total.records |= g.records
        total.logical |= g.logical
        total.partial |= g.partial
        total.replayed |= g.replayed
    group_rows = []
    for key, g in sorted(groups.items(), key=sort_key):
        row: dict[str, Any] = dict(zip(by, key, strict=False))
        row.update(_group_row(g, total))
        group_rows.append(row)
    total_row: dict[str, Any] = {k: ("TOTAL" if i == 0 else None) for i, k in enumerate(by)}
    total_row.update(_group_row(total, total))

    per_run = _per_logical(records, resumed, models_of, flags_of)
    for rid in records.keys() & partial:
        flags_of.setdefault(resumed.get(rid, rid), set()).add(_flag(runs[rid]))
    for rid in replayed:  # every run row of a replayed run says so, wherever its figures came from
        flags_of.setdefault(resumed.get(rid, rid), set()).add("replayed")
    if fast is not None and fast.run_ids:
        per_run = _with_fast_candidates(per_run, fast, resumed, partial, runs, models_of, flags_of, top_n)
    attempts_of = chains(runs, resumed)

    def logical_count(ids: Iterable[str]) -> int:
        return len(_logical(set(ids), resumed, attempt_ids))

    return Chargeback(
        params=dict(params or {}),
        groups=group_rows,
        total=total_row,
        top_runs_by_cost=top_runs(per_run, runs, attempts_of, models_of, flags_of, top_n, 5),
        top_runs_by_idle_cost=top_runs(per_run, runs, attempts_of, models_of, flags_of, top_n, 6),
        top_users_by_cost=top_users(users, top_n, 5, logical_count),
        top_users_by_idle_cost=top_users(users, top_n, 6, logical_count),
        trend=trend_rows(by, trend, trend_total, months),
        anomalies=anomalies(by, trend, months, anomaly_threshold, min_gpu_hours),
        warnings=warnings(warn_models, warn_flags, total),
        total_units=total,
    )


def _line_key(by: tuple[str, ...], run_key: tuple[Any, ...], model: str, instance: str | None) -> tuple[Any, ...]:
    values = iter(run_key)
    return tuple(model if k == "gpu_model" else instance if k == "instance_type" else next(values) for k in by)


_LOGICAL_ID = operator.attrgetter("logical_id")
_REPLAYED = operator.attrgetter("replayed")
_STATUS = operator.attrgetter("status")


def _flag(run: RunInfo) -> str:
    return partial_flag(run.status, run.ended_at) or run.status


def _logical(ids: set[str], resumed: Mapping[str, str], attempt_ids: set[str]) -> set[str]:
    """The logical runs of run records ``ids`` (attempts of a resumed run count once);
    ``attempt_ids``: the keys of ``resumed`` as a set (set & set walks the smaller one)."""
    attempts = ids & attempt_ids
    return (ids - attempts) | {resumed[r] for r in attempts} if attempts else ids


def _with_fast_candidates(per_run, fast, resumed, partial, runs, models_of, flags_of, n):  # type: ignore[no-untyped-def]
    """The logical runs that may rank in the top ``n`` by cost or idle cost, with exact vectors:
    the per-row part (``per_run``) plus the columnar part. Candidates are chosen by float
    estimates with a margin far above their rounding error, then computed exactly."""
    candidates: set[str] = set()
    for index in (5, 6):
        candidates |= fast.near_top(index, n, {k: float(v[index]) for k, v in per_run.items()}, resumed)
    attempts: dict[str, list[str]] = {}
    for rid, logical in resumed.items():
        attempts.setdefault(logical, []).append(rid)
    wanted = [rid for logical in candidates for rid in (logical, *attempts.get(logical, ()))]
    out = {logical: v for logical, v in per_run.items() if logical in candidates}
    for rid, (v, models, flags) in fast.exact(wanted).items():
        logical = resumed.get(rid, rid)
        acc = out.get(logical)
        out[logical] = tuple(v) if acc is None else tuple(map(operator.add, acc, v))
        models_of[logical] = as_set(models_of.get(logical)) | models
        if flags:
            flags_of.setdefault(logical, set()).update(flags)
        if rid in partial:
            flags_of.setdefault(logical, set()).add(_flag(runs[rid]))
    return out


def _members(records: Mapping[str, Any], key_cache: Mapping[str, tuple[Any, ...]]) -> dict[tuple[Any, ...], set[str]]:
    out: dict[tuple[Any, ...], list[str]] = {}
    for rid in records:
        out.setdefault(key_cache[rid], []).append(rid)
    return {k: set(v) for k, v in out.items()}


def _per_logical(records, resumed, models_of, flags_of):  # type: ignore[no-untyped-def]
    """Vectors per logical run: the attempts of a resumed run summed into its first attempt's
    entry, with their models and flags."""
    attempts = records.keys() & resumed.keys()
    if not attempts:
        return records
    per_run = dict(records)
    for run_id in attempts:
        logical = resumed[run_id]
        v = per_run.pop(run_id)
        acc = per_run.get(logical)
        per_run[logical] = tuple(v) if acc is None else tuple(map(operator.add, acc, v))
        models_of[logical] = as_set(models_of.get(logical)) | as_set(models_of.get(run_id))
        flags_of.setdefault(logical, set()).update(flags_of.get(run_id, ()))
    return per_run


def _group_row(g: Totals, total: Totals) -> dict[str, Any]:
    return {
        "runs": len(g.logical),
        "attempts": len(g.records),
        **usage_columns(g),
        "share": share(g.cost, total.cost),
        "partial_runs": len(g.partial),
        "replayed_runs": len(g.replayed),
    }


def money_total(lines: Iterable[CostLine]) -> Decimal:
    """The exact cost of ``lines`` (for tests and callers that want a Decimal)."""
    return money_decimal(sum(ln.cost for ln in lines))
