"""Chargeback: priced lines summed by group, with the top spenders, the monthly trend and anomalies.

Pure. Sums are integers (money.py), so the groups add up exactly to the total. Output rows follow
``chargeback_columns.COLUMNS`` (names, order, units): hours and ratios as floats rounded to 6
places, money as exact decimal strings.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from gpuledger.core.chargeback_columns import GROUP_KEYS
from gpuledger.core.cost import Compact, CostLine, compact
from gpuledger.core.money import EXACT, MONEY_SCALE, UH_PER_H, money_decimal, money_str
from gpuledger.core.units import iso_utc
from gpuledger.core.usage import PARTIAL_STATUSES

__all__ = ["Chargeback", "RunInfo", "Totals", "build_chargeback", "build_from_compact", "usage_columns"]

_A100_SCALE = 10**10
_ENERGY_SCALE = 10**9
_RATIO_Q = Decimal("0.000001")


@dataclass(frozen=True, slots=True)
class RunInfo:
    id: str
    logical_id: str  # the first attempt of a resumed run's chain (its own id otherwise)
    status: str
    user: str
    team: str | None = None
    project: str | None = None
    name: str | None = None
    started_at: float = 0.0


class Totals:
    """Integer sums of priced pieces (AMOUNTS order, cost.py), plus which runs contributed."""

    __slots__ = (
        "a100eq",
        "alloc_uh",
        "busy_uh",
        "cost",
        "energy",
        "energy_cost",
        "idle_cost",
        "logical",
        "partial",
        "records",
        "unmeasured_uh",
        "unpriced_uh",
    )

    def __init__(self) -> None:
        self.alloc_uh = self.busy_uh = self.unmeasured_uh = self.a100eq = self.energy = 0
        self.cost = self.idle_cost = self.energy_cost = self.unpriced_uh = 0
        self.logical: set[str] = set()
        self.records: set[str] = set()
        self.partial: set[str] = set()

    def add_vec(self, v: Sequence[int]) -> None:
        self.alloc_uh += v[0]
        self.busy_uh += v[1]
        self.unmeasured_uh += v[2]
        self.a100eq += v[3]
        self.energy += v[4]
        self.cost += v[5]
        self.idle_cost += v[6]
        self.energy_cost += v[7]
        self.unpriced_uh += v[8]

    def add(self, ln: CostLine, info: RunInfo | None = None) -> None:
        self.add_vec(compact(ln)[5])
        self.records.add(ln.run_id)
        if info is not None:
            self.logical.add(info.logical_id)
            if info.status in PARTIAL_STATUSES:
                self.partial.add(info.id)

    def merge(self, other: Totals) -> None:
        self.add_vec(other.vector())
        self.logical |= other.logical
        self.records |= other.records
        self.partial |= other.partial

    def vector(self) -> list[int]:
        return [
            self.alloc_uh,
            self.busy_uh,
            self.unmeasured_uh,
            self.a100eq,
            self.energy,
            self.cost,
            self.idle_cost,
            self.energy_cost,
            self.unpriced_uh,
        ]

    @property
    def idle_uh(self) -> int:
        return self.alloc_uh - self.busy_uh - self.unmeasured_uh

    def cost_per_a100eq(self) -> Decimal | None:
        if self.a100eq <= 0:
            return None
        # cost / (a100eq x 10^-10 h), from exact integers; rounded once for display.
        value = Decimal(self.cost * _A100_SCALE).scaleb(-MONEY_SCALE, EXACT) / Decimal(self.a100eq)
        return value.quantize(_RATIO_Q, ROUND_HALF_EVEN, EXACT)

    def utilization(self) -> float | None:
        measured = self.alloc_uh - self.unmeasured_uh
        return None if measured <= 0 else round(self.busy_uh / measured, 6)

    def idle_share(self) -> float | None:
        measured = self.alloc_uh - self.unmeasured_uh
        return None if measured <= 0 else round(self.idle_uh / measured, 6)


def _h(uh: int) -> float:
    return round(uh / UH_PER_H, 6)


def usage_columns(t: Totals) -> dict[str, Any]:
    """The usage and money columns shared by every section (COLUMNS' ``_USAGE``)."""
    per = t.cost_per_a100eq()
    return {
        "allocated_gpu_h": _h(t.alloc_uh),
        "busy_gpu_h": _h(t.busy_uh),
        "idle_gpu_h": _h(t.idle_uh),
        "unmeasured_gpu_h": _h(t.unmeasured_uh),
        "mean_utilization": t.utilization(),
        "a100eq_h": round(t.a100eq / _A100_SCALE, 10),  # as many places as the units: exact
        "energy_kwh": round(t.energy / _ENERGY_SCALE, 9),
        "cost": money_str(t.cost),
        "idle_cost": money_str(t.idle_cost),
        "energy_cost": money_str(t.energy_cost),
        "cost_per_a100eq_h": None if per is None else format(per, "f"),
        "unpriced_gpu_h": _h(t.unpriced_uh),
    }


def _share(part: int, whole: int) -> float | None:
    return None if whole <= 0 else round(part / whole, 6)


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


def _sort_key(item: tuple[tuple[str | None, ...], Any]) -> tuple[Any, ...]:
    return tuple((v is None, v or "") for v in item[0])


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
    key_cache: dict[str, tuple[Any, ...]] = {}
    cells: dict[tuple[Any, str, bool], list[int]] = {}
    line_members: dict[tuple[Any, ...], set[str]] = {}  # only when the key depends on the piece
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
            key = (key, model, instance)
        inside = t0 >= start
        cell = cells.get((key, month, inside))
        if cell is None:
            cells[(key, month, inside)] = list(v)
        else:
            cell[:] = map(add, cell, v)
        if not inside:
            continue
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
        if per_line:
            line_members.setdefault(key, set()).add(run_id)
        if flags:
            flags_of.setdefault(run_id, set()).update(flags)
            for flag in flags:
                if flag in _WARN_FLAGS:
                    warn_flags.setdefault(flag, set()).add(str(instance if flag == "unknown_instance" else model))
        if v[8]:
            warn_models[model] = warn_models.get(model, 0) + v[8]
    for run_values, model, instance, month, v in trend_items:
        key = (run_values, model, instance) if per_line else run_values
        cell = cells.get((key, month, False))
        if cell is None:
            cells[(key, month, False)] = list(v)
        else:
            cell[:] = map(add, cell, v)

    if per_line:  # inner keys -> keys in ``by`` order
        order = {k: _line_key(by, *k) for k in {key for key, _, _ in cells}}
        cells = {(order[k], month, inside): v for (k, month, inside), v in cells.items()}
        line_members = {order[k]: ids for k, ids in line_members.items()}
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
    for key, g in sorted(groups.items(), key=_sort_key):
        row: dict[str, Any] = dict(zip(by, key, strict=False))
        row.update(_group_row(g, total))
        group_rows.append(row)
    total_row: dict[str, Any] = {k: ("TOTAL" if i == 0 else None) for i, k in enumerate(by)}
    total_row.update(_group_row(total, total))

    per_run = _per_logical(records, resumed, models_of, flags_of)
    for rid in records.keys() & partial:
        flags_of.setdefault(resumed.get(rid, rid), set()).add(runs[rid].status)
    chains = _chains(runs)
    per_user = {user: (acc[0], {resumed.get(r, r) for r in acc[1]}) for user, acc in users.items() if acc[1]}
    return Chargeback(
        params=dict(params or {}),
        groups=group_rows,
        total=total_row,
        top_runs_by_cost=_top_runs(per_run, runs, chains, models_of, flags_of, top_n, 5),
        top_runs_by_idle_cost=_top_runs(per_run, runs, chains, models_of, flags_of, top_n, 6),
        top_users_by_cost=_top_users(per_user, top_n, 5),
        top_users_by_idle_cost=_top_users(per_user, top_n, 6),
        trend=_trend_rows(by, trend, trend_total, months),
        anomalies=_anomalies(by, trend, months, anomaly_threshold, min_gpu_hours),
        warnings=_warnings(warn_models, warn_flags, total),
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
        models_of[logical] = _as_set(models_of.get(logical)) | _as_set(models_of.get(run_id))
        flags_of.setdefault(logical, set()).update(flags_of.get(run_id, ()))
    return per_run


def _as_set(models: Any) -> set[str]:
    if models is None:
        return set()
    return set(models) if isinstance(models, set) else {models}


def _totals_of(v: Sequence[int]) -> Totals:
    t = Totals()
    t.add_vec(v)
    return t


def _group_row(g: Totals, total: Totals) -> dict[str, Any]:
    return {
        "runs": len(g.logical),
        "attempts": len(g.records),
        **usage_columns(g),
        "share": _share(g.cost, total.cost),
        "partial_runs": len(g.partial),
    }


def _chains(runs: Mapping[str, RunInfo]) -> dict[str, list[RunInfo]]:
    """The attempts of each resumed run (logical id -> attempts, first first); runs of one
    attempt are not listed."""
    out: dict[str, list[RunInfo]] = {}
    for info in runs.values():
        if info.logical_id != info.id:
            out.setdefault(info.logical_id, []).append(info)
    for logical, chain in out.items():
        root = runs.get(logical)
        if root is not None:
            chain.append(root)
        chain.sort(key=lambda r: (r.started_at, r.id))
    return out


def _top_runs(per_run, runs, chains, models_of, flags_of, n, index) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    # (amount, id) pairs compare in C; ties go to the smaller id, as the docs' tests expect.
    ranked = heapq.nlargest(n, zip(map(operator.itemgetter(index), per_run.values()), map(_neg, per_run), strict=False))
    best = [(run_id.s, per_run[run_id.s]) for _, run_id in ranked]
    out = []
    for rank, (logical, v) in enumerate(best, 1):
        if v[index] <= 0:
            break
        chain = chains.get(logical) or []
        first = chain[0] if chain else runs.get(logical)
        last = chain[-1] if chain else first
        out.append(
            {
                "rank": rank,
                "run_id": logical,
                "name": first.name if first else None,
                "user": first.user if first else None,
                "team": first.team if first else None,
                "project": first.project if first else None,
                "status": last.status if last else None,
                "attempts": max(1, len(chain)),
                "started_at": iso_utc(first.started_at) if first else None,
                "gpu_models": ";".join(sorted(_as_set(models_of.get(logical)))),
                **usage_columns(_totals_of(v)),
                "flags": ";".join(sorted(flags_of.get(logical, ()))),
            }
        )
    return out


class _neg:
    """Reverses string order inside ``heapq.nlargest``: the smaller run id wins a tie."""

    __slots__ = ("s",)

    def __init__(self, s: str) -> None:
        self.s = s

    def __lt__(self, other: _neg) -> bool:
        return self.s > other.s


def _top_users(per_user, n, index) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    best = heapq.nsmallest(n, per_user.items(), key=lambda kv: (-kv[1][0][index], kv[0]))
    return [
        {"rank": rank, "user": user, "runs": len(logical), **usage_columns(_totals_of(v))}
        for rank, (user, (v, logical)) in enumerate(best, 1)
        if v[index] > 0
    ]


def _trend_row(month: str, t: Totals) -> dict[str, Any]:
    per = t.cost_per_a100eq()
    return {
        "month": month,
        "allocated_gpu_h": _h(t.alloc_uh),
        "busy_gpu_h": _h(t.busy_uh),
        "idle_share": t.idle_share(),
        "a100eq_h": round(t.a100eq / _A100_SCALE, 10),
        "cost": money_str(t.cost),
        "cost_per_a100eq_h": None if per is None else format(per, "f"),
    }


def _trend_rows(by, trend, trend_total, months) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    keys = sorted({k for k, _ in trend}, key=lambda k: _sort_key((k, None)))
    rows = []
    for key in keys:
        for month in months:
            t = trend.get((key, month))
            if t is not None:
                rows.append({**dict(zip(by, key, strict=False)), **_trend_row(month, t)})
    for month in months:
        rows.append(
            {
                **{k: ("TOTAL" if i == 0 else None) for i, k in enumerate(by)},
                **_trend_row(month, trend_total.get(month, Totals())),
            }
        )
    return rows


def _metrics(t: Totals) -> dict[str, float | None]:
    per = t.cost_per_a100eq()
    return {"cost_per_a100eq_h": None if per is None else float(per), "idle_share": t.idle_share()}


def _anomalies(by, trend, months, threshold, min_gpu_hours) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    if len(months) < 2:
        return []
    current_month, earlier = months[-1], months[:-1]
    min_uh = min_gpu_hours * UH_PER_H
    out = []
    for (key, month), t in sorted(trend.items(), key=lambda kv: _sort_key((kv[0][0], None))):
        if month != current_month or t.alloc_uh < min_uh:
            continue
        history = [trend.get((key, m)) for m in earlier]
        history = [h for h in history if h is not None and h.alloc_uh >= min_uh]
        if not history:
            continue
        now = _metrics(t)
        for metric in ("cost_per_a100eq_h", "idle_share"):
            values = [v for v in (_metrics(h)[metric] for h in history) if v is not None]
            current = now[metric]
            if not values or current is None:
                continue
            baseline = sum(values) / len(values)
            if baseline <= 0:
                continue
            change = (current - baseline) / baseline
            if change > threshold:
                out.append(
                    {
                        **dict(zip(by, key, strict=False)),
                        "metric": metric,
                        "baseline": round(baseline, 6),
                        "current": round(current, 6),
                        "change": round(change, 6),
                    }
                )
    return out


def _warnings(models: dict[str, int], flags: dict[str, set[str]], total: Totals) -> list[str]:
    out = []
    for model, uh in sorted(models.items()):
        out.append(f"{_h(uh):,.2f} GPU-h on {model} have no rate in the rate card (not in cost)")
    texts = {
        "unknown_model": "GPU names not in the normalisation table (no A100-equivalent hours): {}",
        "no_factor": "GPU models without a normalisation factor (no A100-equivalent hours): {}",
        "unknown_instance": "instance types not in the rate card (priced by GPU model): {}",
        "mig_unknown": "MIG slices whose fraction is unknown (priced as whole GPUs): {}",
        "instance_model_mismatch": "GPUs whose model differs from their instance type's: {}",
    }
    for flag, text in texts.items():
        if flag in flags:
            out.append(text.format(", ".join(sorted(str(x) for x in flags[flag]))))
    if total.partial:
        out.append(
            f"{len(total.partial)} runs killed, lost, failed or still running: "
            "priced up to their last recorded interval"
        )
    return out


def money_total(lines: Iterable[CostLine]) -> Decimal:
    """The exact cost of ``lines`` (for tests and callers that want a Decimal)."""
    return money_decimal(sum(ln.cost for ln in lines))
