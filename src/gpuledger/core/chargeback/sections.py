"""The sections of a chargeback beyond its groups: top runs and users, the monthly trend, the
anomalies and the notes. Pure; fed by chargeback.build_from_compact."""

from __future__ import annotations

import heapq
import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuledger.core.chargeback.totals import A100_SCALE, Totals, as_set, hours, sort_key, totals_of, usage_columns
from gpuledger.core.money import UH_PER_H, money_str
from gpuledger.core.units import fmt_count, iso_utc

if TYPE_CHECKING:
    from gpuledger.core.chargeback.totals import RunInfo

__all__ = ["anomalies", "chains", "top_runs", "top_users", "trend_rows", "warnings"]


def chains(runs: Mapping[str, RunInfo], resumed: Mapping[str, str] | None = None) -> dict[str, list[RunInfo]]:
    """The attempts of each resumed run (logical id -> attempts, first first); runs of one
    attempt are not listed. ``resumed``: run id -> logical id of the attempts, if known."""
    out: dict[str, list[RunInfo]] = {}
    attempts = (runs[rid] for rid in resumed) if resumed is not None else runs.values()
    for info in attempts:
        if info.logical_id != info.id:
            out.setdefault(info.logical_id, []).append(info)
    for logical, chain in out.items():
        root = runs.get(logical)
        if root is not None:
            chain.append(root)
        chain.sort(key=lambda r: (r.started_at, r.id))
    return out


def top_runs(per_run, runs, attempts_of, models_of, flags_of, n, index) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    # (amount, id) pairs compare in C; ties go to the smaller id, as the docs' tests expect.
    ranked = heapq.nlargest(n, zip(map(operator.itemgetter(index), per_run.values()), map(_neg, per_run), strict=False))
    best = [(run_id.s, per_run[run_id.s]) for _, run_id in ranked]
    out = []
    for rank, (logical, v) in enumerate(best, 1):
        if v[index] <= 0:
            break
        chain = attempts_of.get(logical) or []
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
                "gpu_models": ";".join(sorted(as_set(models_of.get(logical)))),
                **usage_columns(totals_of(v)),
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


def top_users(per_user, n, index, count=len) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """The ``n`` users with the most ``index`` amount: per_user is user -> (vector, runs), and
    ``count(runs)`` their number of runs (called for those shown only)."""
    best = heapq.nsmallest(n, per_user.items(), key=lambda kv: (-kv[1][0][index], kv[0]))
    return [
        {"rank": rank, "user": user, "runs": count(runs), **usage_columns(totals_of(v))}
        for rank, (user, (v, runs)) in enumerate(best, 1)
        if v[index] > 0
    ]


def _trend_row(month: str, t: Totals) -> dict[str, Any]:
    per = t.cost_per_a100eq()
    return {
        "month": month,
        "allocated_gpu_h": hours(t.alloc_uh),
        "busy_gpu_h": hours(t.busy_uh),
        "idle_share": t.idle_share(),
        "a100eq_h": round(t.a100eq / A100_SCALE, 10),
        "cost": money_str(t.cost),
        "cost_per_a100eq_h": None if per is None else format(per, "f"),
    }


def trend_rows(by, trend, trend_total, months) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    keys = sorted({k for k, _ in trend}, key=lambda k: sort_key((k, None)))
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


def anomalies(by, trend, months, threshold, min_gpu_hours) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    if len(months) < 2:
        return []
    current_month, earlier = months[-1], months[:-1]
    min_uh = min_gpu_hours * UH_PER_H
    out = []
    for (key, month), t in sorted(trend.items(), key=lambda kv: sort_key((kv[0][0], None))):
        if month != current_month or t.alloc_uh < min_uh:
            continue
        history = [trend.get((key, m)) for m in earlier]
        history = [h for h in history if h is not None and h.alloc_uh >= min_uh]
        if not history:
            continue
        now = _metrics(t)
        past = [_metrics(h) for h in history]
        for metric in ("cost_per_a100eq_h", "idle_share"):
            values = [v for v in (m[metric] for m in past) if v is not None]
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


def warnings(models: dict[str, int], flags: dict[str, set[str]], total: Totals) -> list[str]:
    out = []
    for model, uh in sorted(models.items()):
        out.append(f"{hours(uh):,.2f} GPU-h on {model} have no rate in the rate card (not in cost)")
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
            f"{fmt_count(len(total.partial), 'run')} killed, lost, failed or still running: "
            "priced up to their last recorded interval"
        )
    return out
