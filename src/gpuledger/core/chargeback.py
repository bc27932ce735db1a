"""Chargeback: priced lines summed by group, with the top spenders, the monthly trend and anomalies.

Pure. Sums are integers (money.py), so the groups add up exactly to the total. Output rows follow
``chargeback_columns.COLUMNS`` (names, order, units): hours and ratios as floats rounded to 6
places, money as exact decimal strings.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpuledger.core.chargeback_columns import GROUP_KEYS
from gpuledger.core.chargeback_sections import anomalies, chains, top_runs, top_users, trend_rows, warnings
from gpuledger.core.chargeback_totals import RunInfo, Totals, as_set, share, sort_key, usage_columns
from gpuledger.core.cost import Compact, CostLine, compact
from gpuledger.core.money import money_decimal
from gpuledger.core.usage import PARTIAL_STATUSES

__all__ = ["Chargeback", "RunInfo", "Totals", "build_chargeback", "build_from_compact", "usage_columns"]


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
) -> Chargeback:
    """Sum priced pieces by the ``by`` keys. Pieces starting before ``start`` belong to the trend
    only (``months``: the trend's months in order, the report's own months last); so do
    ``trend_items``, (values of the run keys among ``by`` in their order, model, instance type,
    month, amounts) priced from per-group sums. One pass over the
    pieces fills (group, month) cells and per-run vectors; everything else is summed from those.
    ``runs`` values need the attributes of RunInfo."""
    by = tuple(by)
    bad = [k for k in by if k not in GROUP_KEYS]
    if bad or not by:
        raise ValueError(f"group by one or more of {', '.join(GROUP_KEYS)} (got {', '.join(by) or 'nothing'})")
    run_keys = [k for k in by if k not in ("gpu_model", "instance_type")]
    per_line = len(run_keys) < len(by)  # the key depends on the piece, not only on the run
    by_model, by_instance = "gpu_model" in by, "instance_type" in by
    key_cache: dict[str, tuple[Any, ...]] = {}
    cells: dict[tuple[Any, str, bool], list[int]] = {}
    line_members: dict[tuple[Any, ...], set[str]] = {}  # only when the key depends on the piece
    inner_of: dict[str, Any] = {}  # run -> its inner key, or a set of them (per_line only)
    records: dict[str, Sequence[int]] = {}  # in the window, per run record
    models_of: dict[str, Any] = {}  # a model key, or a set of them for a run on several models
    flags_of: dict[str, set[str]] = {}
    warn_models: dict[str, int] = {}
    warn_flags: dict[str, set[str]] = {}
    add = operator.add
    # The loop runs once per priced piece (hundreds of thousands for a year): kept lean on purpose.
    users: dict[str, list[Any]] = {}  # user -> [summed vector, set of run records]
    for run_id, model, instance, month, t0, v, flags in items:
        cached = key_cache.get(run_id)
        if cached is None:
            info = runs.get(run_id)
            run_key = tuple(None if info is None else getattr(info, k) for k in run_keys)
            user = "" if info is None else info.user
            cached = key_cache[run_id] = (run_key, users.setdefault(user, [[0] * 9, set()]))
        key, user_acc = cached
        if per_line:  # an inner key, put in ``by`` order once per group at the end
            key = (key, model if by_model else None, instance if by_instance else None)
        inside = t0 >= start
        cell = cells.get((key, month, inside))
        if cell is None:
            cells[(key, month, inside)] = list(v)
        else:
            cell[:] = map(add, cell, v)
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
        user_vector = user_acc[0]
        user_vector[:] = map(add, user_vector, v)
        user_acc[1].add(run_id)
        if flags:
            flags_of.setdefault(run_id, set()).update(flags)
            for flag in flags:
                if flag in _WARN_FLAGS:
                    warn_flags.setdefault(flag, set()).add(str(instance if flag == "unknown_instance" else model))
        if v[8]:
            warn_models[model] = warn_models.get(model, 0) + v[8]
    for run_values, model, instance, month, v in trend_items:
        key = (run_values, model if by_model else None, instance if by_instance else None) if per_line else run_values
        cell = cells.get((key, month, False))
        if cell is None:
            cells[(key, month, False)] = list(v)
        else:
            cell[:] = map(add, cell, v)

    if per_line:  # inner keys -> keys in ``by`` order (one to one: both hold exactly the ``by`` values)
        order = {k: _line_key(by, *k) for k in {key for key, _, _ in cells}}
        cells = {(order[k], month, inside): v for (k, month, inside), v in cells.items()}
        for run_id, inner_keys in inner_of.items():  # a run is a member of each group it has pieces in
            for inner in inner_keys if isinstance(inner_keys, set) else (inner_keys,):
                line_members.setdefault(order[inner], set()).add(run_id)
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
    # Which runs count as what, by set algebra (C speed) rather than a lookup per member.
    resumed = {rid: info.logical_id for rid, info in runs.items() if info.logical_id != rid}
    partial = {rid for rid, info in runs.items() if info.status in PARTIAL_STATUSES}
    for key, ids in members.items():
        g = groups[key]
        g.records = ids
        attempts = ids & resumed.keys()
        g.logical = (ids - attempts) | {resumed[r] for r in attempts} if attempts else ids
        g.partial = ids & partial
        total.records |= g.records
        total.logical |= g.logical
        total.partial |= g.partial
    group_rows = []
    for key, g in sorted(groups.items(), key=sort_key):
        row: dict[str, Any] = dict(zip(by, key, strict=False))
        row.update(_group_row(g, total))
        group_rows.append(row)
    total_row: dict[str, Any] = {k: ("TOTAL" if i == 0 else None) for i, k in enumerate(by)}
    total_row.update(_group_row(total, total))

    per_run = _per_logical(records, resumed, models_of, flags_of)
    for rid in records.keys() & partial:
        flags_of.setdefault(resumed.get(rid, rid), set()).add(runs[rid].status)
    attempts_of = chains(runs)
    per_user = {user: (acc[0], {resumed.get(r, r) for r in acc[1]}) for user, acc in users.items() if acc[1]}
    return Chargeback(
        params=dict(params or {}),
        groups=group_rows,
        total=total_row,
        top_runs_by_cost=top_runs(per_run, runs, attempts_of, models_of, flags_of, top_n, 5),
        top_runs_by_idle_cost=top_runs(per_run, runs, attempts_of, models_of, flags_of, top_n, 6),
        top_users_by_cost=top_users(per_user, top_n, 5),
        top_users_by_idle_cost=top_users(per_user, top_n, 6),
        trend=trend_rows(by, trend, trend_total, months),
        anomalies=anomalies(by, trend, months, anomaly_threshold, min_gpu_hours),
        warnings=warnings(warn_models, warn_flags, total),
        total_units=total,
    )


def _line_key(by: tuple[str, ...], run_key: tuple[Any, ...], model: str, instance: str | None) -> tuple[Any, ...]:
    values = iter(run_key)
    return tuple(model if k == "gpu_model" else instance if k == "instance_type" else next(values) for k in by)


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
    }


def money_total(lines: Iterable[CostLine]) -> Decimal:
    """The exact cost of ``lines`` (for tests and callers that want a Decimal)."""
    return money_decimal(sum(ln.cost for ln in lines))
