"""Cost use cases: the monthly chargeback, the cost of given runs, value for money, rollups.

Each takes the reader's ``scope`` (the projects they may see; None = all) as a required keyword,
so no caller gets everything by forgetting it. The team server passes the person's projects; the
local CLI passes None explicitly.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import itertools
import os
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuledger.core.chargeback.fast import price_plain_rows
from gpuledger.core.chargeback.report import Chargeback, Totals, build_from_compact, grouping, usage_columns
from gpuledger.core.chargeback.value import ValueForMoney, value_for_money, yolo_inputs
from gpuledger.core.ids import short_id
from gpuledger.core.model import run_is_open
from gpuledger.core.money import money_decimal
from gpuledger.core.pricing.cost import CostLine, Pricer, compact, month_bounds, month_of, month_starts
from gpuledger.core.pricing.ratecard import RateCard
from gpuledger.core.pricing.ratecard_load import RateCardError, default_rate_card, parse_rate_card
from gpuledger.core.pricing.usage import PARTIAL_STATUSES, partial_flag
from gpuledger.reports.cost.replayed import REPLAYED_FLAG, replayed_warning
from gpuledger.reports.cost.tiered import tiered_intervals
from gpuledger.reports.cost.usage import Scope, collect_report, collect_runs, read
from gpuledger.store.audit_approve import unsealed_among
from gpuledger.store.cost_queries import replayed_in_window
from gpuledger.store.series_cut_days import CutDays

if TYPE_CHECKING:
    from gpuledger.store import Ledger

__all__ = ["chargeback", "load_rate_card", "month_window", "run_costs", "run_value", "window_from_args"]


def load_rate_card(path: str | os.PathLike[str] | None) -> RateCard:
    """The card in ``path`` (TOML, docs/RATE_CARDS.md), or the default example card."""
    if path is None:
        return default_rate_card()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise RateCardError([f"{path}: cannot read the rate card: {exc.strerror or exc}"]) from exc
    return parse_rate_card(text, os.fspath(path))


# -- windows ---------------------------------------------------------------------------------------


def month_window(month: str) -> tuple[float, float]:
    try:
        year, mon = (int(x) for x in month.split("-"))
        dt.date(year, mon, 1)
    except (ValueError, TypeError):
        raise ValueError(f"--month {month!r}: write it as YYYY-MM, e.g. 2026-03") from None
    return month_bounds(f"{year:04d}-{mon:02d}")


def _instant(text: str, *, end: bool) -> float:
    """A date (the whole day: its start, or for an end, the next midnight) or an ISO date-time (UTC if no offset)."""
    try:
        if len(text) == 10:
            day = dt.date.fromisoformat(text)
            if end:
                day += dt.timedelta(days=1)
            return dt.datetime(day.year, day.month, day.day, tzinfo=dt.timezone.utc).timestamp()
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r}: write a date (2026-03-15) or a date-time (2026-03-15T12:00:00Z)") from None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)).timestamp()


def window_from_args(month: str | None, start: str | None, end: str | None, now: float) -> tuple[float, float]:
    """--month YYYY-MM, or --from / --to (dates are whole days, --to inclusive), default: this month."""
    if month and (start or end):
        raise ValueError("give --month or --from/--to, not both")
    if month:
        return month_window(month)
    if start or end:
        lo = _instant(start, end=False) if start else month_bounds(month_of(now))[0]
        hi = _instant(end, end=True) if end else now
        if hi <= lo:
            raise ValueError("--to must be after --from")
        return lo, hi
    return month_bounds(month_of(now))


def _months_back(start: float, n: int) -> float:
    t = month_bounds(month_of(start))[0]
    for _ in range(n):
        t = month_bounds(month_of(t - 1))[0]
    return t


# -- chargeback ------------------------------------------------------------------------------------


_RUN_KEYS = ("team", "project", "user", "status")


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """A year's report makes millions of small objects that all live to its end; the cyclic
    garbage collector would rescan them again and again (about a third of the run time) and can
    free none of them. Paused while the report is built, restored after, whatever happens."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def chargeback(
    ledger: Ledger,
    *,
    scope: Scope,
    card: RateCard,
    start: float,
    end: float,
    by: Sequence[str] = ("team",),
    basis: str | None = None,
    trend_months: int = 3,
    top_n: int = 10,
    anomaly_threshold: float = 0.25,
    min_gpu_hours: float = 1.0,
    include_replayed: bool = False,
) -> Chargeback:
    """The chargeback of [start, end) by ``by``, with ``trend_months`` earlier months for the
    trend and the anomalies (docs/CHARGEBACK.md). The report's own window is priced run by run;
    the earlier months, shown only as a trend, from rollup sums per group. Runs of a replayed GPU
    trace are not billed unless ``include_replayed`` (then marked: ``replayed_runs``, flags)."""
    trend_start = _months_back(start, trend_months)
    months = [month_of(trend_start)] + [month_of(t) for t in month_starts(trend_start, end)]
    cut_times = sorted({start, end} | {t for t in card.change_points if trend_start < t < end})
    edges = {trend_start, *month_starts(trend_start, end), *cut_times}
    keys = [k for k in by if k in _RUN_KEYS]
    params = {
        "currency": card.currency,
        "basis": basis or card.basis,
        "rate_card": card.name or card.source,
        "rate_card_source": card.source,
        "from": _iso(start),
        "to": _iso(end),
        "by": list(by),
        "scope": None if scope is None else sorted(scope),
        "trend_months": months,
        "anomaly_threshold": anomaly_threshold,
        "include_replayed": include_replayed,
    }
    pricer = Pricer(card, basis, trend_start, end, cuts=(start,))
    window = {"scope": scope, "trend_start": trend_start, "start": start, "end": end, "replayed": include_replayed}
    window.update(edges=edges, cut_times=cut_times, group_keys=keys)
    report = {"by": by, "start": start, "months": months, "top_n": top_n, "params": params}
    report.update(anomaly_threshold=anomaly_threshold, min_gpu_hours=min_gpu_hours)
    with _gc_paused():
        # In a function of its own: its millions of rows are freed (by reference counting) when
        # it returns, before the collector is back, which would otherwise walk them all once.
        return _priced(ledger, pricer, window, report)


def _priced(ledger: Ledger, pricer: Pricer, window: dict[str, Any], report: dict[str, Any]) -> Chargeback:
    """Read (collect_report's ``window`` arguments), price and sum (build_from_compact's ``report``)."""
    series = CutDays.of(ledger)  # a series-only run's days with a price change, read from its store
    usage = read(ledger, lambda conn: collect_report(conn, **window, series=series))
    by = report["by"]
    run_keys, by_model, by_instance = grouping(by)
    fast, unusual = price_plain_rows(
        usage.rollups,
        usage.runs,
        pricer,
        usage.period_of_day,
        usage.periods,
        start=window["start"],
        end=window["end"],
        run_keys=run_keys,
        by_model=by_model,
        by_instance=by_instance,
    )
    items = itertools.chain(
        (compact(ln) for ln in pricer.price_all(usage.usages)),
        pricer.price_rollups(unusual, usage.runs, usage.period_of_day, usage.periods),
    )
    trend = _group_items(pricer, usage.groups, usage.periods, by, window["group_keys"])
    cb = build_from_compact(items, usage.runs, fast=fast, trend_items=trend, **report)
    _note_unsealed(ledger, cb, usage.runs)
    cb.warnings += series.notes()
    note_replayed(ledger, cb, scope=window["scope"], start=window["start"], end=window["end"])
    return cb


def note_replayed(ledger: Ledger, cb: Chargeback, *, scope: Scope, start: float, end: float) -> None:
    """Say which replayed runs of the window the chargeback ``cb`` left out, or put in (marked):
    params ``replayed_runs`` (those billed, with --include-replayed) and a warning."""
    included = bool(cb.params.get("include_replayed"))
    billed = sorted(cb.total_units.replayed)
    cb.params["replayed_runs"] = billed
    ids = billed if included else read(ledger, lambda conn: replayed_in_window(conn, scope=scope, start=start, end=end))
    if ids:
        cb.warnings.append(replayed_warning(ids, included))


def _note_unsealed(ledger: Ledger, cb: Chargeback, runs: Mapping[str, Any]) -> None:
    """Say which finished runs billed here the audit trail does not vouch for (never sealed)."""
    billed = (runs.get(rid) for rid in cb.total_units.records)
    finished = [r.id for r in billed if r is not None and not run_is_open(r.status, r.ended_at)]
    unsealed = read(ledger, lambda conn: unsealed_among(conn, finished))
    cb.params["unsealed_runs"] = unsealed
    if unsealed:
        shown = ", ".join(short_id(x) for x in unsealed[:5]) + (", ..." if len(unsealed) > 5 else "")
        n = len(unsealed)
        runs_were = "1 finished run billed here was" if n == 1 else f"{n} finished runs billed here were"
        cb.warnings.append(
            f"{runs_were} never sealed in the audit trail ({shown}): the figures are not protected until an admin "
            "approves (gpuledger audit seal)"
        )


def _group_items(
    pricer: Pricer,
    groups: Sequence[tuple[Any, ...]],
    periods: Sequence[tuple[float, bool]],
    by: Sequence[str],
    keys: list[str],
) -> list[tuple[tuple[Any, ...], str | None, str | None, str, tuple[int, ...]]]:
    """Rollup sums per group (UsageSet.groups) priced: (run key values, model, instance type,
    month, amounts), as build_from_compact takes them."""
    n = len(keys)
    # (row id, gpu_name, mig_profile, instance_type, period, t0, t1, alloc_s, busy_s, energy_j, share_rule)
    rows = [(str(i), g[n + 1], g[n + 2], g[n], *g[n + 3 :]) for i, g in enumerate(groups)]
    out = []
    for row_id, model, instance, month, _, v, _ in pricer.price_sums(rows, periods):
        out.append((groups[int(row_id)][:n], model, instance, month, v))
    return out


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).isoformat().replace("+00:00", "Z")


# -- cost of runs ----------------------------------------------------------------------------------


def _rates(lines: Sequence[CostLine]) -> str:
    seen: list[str] = []
    for ln in sorted(lines, key=lambda ln: ln.t0):
        rate = "" if ln.line is None else format(ln.line.rate, "f")
        if rate and rate not in seen:
            seen.append(rate)
    return ";".join(seen)


def _flags(lines: Sequence[CostLine], status: str | None, replayed: bool = False) -> str:
    found = {f for ln in lines for f in ln.flags}
    if status in PARTIAL_STATUSES:
        found.add(str(status))
    if replayed:
        found.add(REPLAYED_FLAG)
    return ";".join(sorted(found))


def _cost_row(
    run_id: str,
    lines: Sequence[CostLine],
    device: dict[str, Any] | None,
    status: str | None,
    replayed: bool = False,
) -> dict[str, Any]:
    t = Totals()
    for ln in lines:
        t.add(ln)
    models = sorted({ln.model for ln in lines})
    instances = sorted({ln.instance_type for ln in lines if ln.instance_type})
    return {
        "run_id": run_id,
        "gpu_index": device.get("index") if device else None,
        "gpu_uuid": device.get("uuid") if device else None,
        "gpu_model": ";".join(models),
        "mig_profile": device.get("mig_profile") if device else None,
        "instance_type": ";".join(instances) or None,
        "rate": _rates(lines),
        **usage_columns(t),
        "flags": _flags(lines, status, replayed),
    }


def run_costs(
    ledger: Ledger,
    run_ids: Sequence[str],
    *,
    scope: Scope,
    card: RateCard,
    basis: str | None = None,
    instance_type: str | None = None,
) -> dict[str, Any]:
    """Per run and GPU, per run and in total (COLUMNS["cost"]); a resumed run also gets the total
    of all its attempts (``logical_run``). Runs outside ``scope`` are not found. A run of a
    replayed GPU trace shows its figures, flagged ``replayed`` with ``billed`` false: no bill
    counts it (docs/CHARGEBACK.md)."""
    from gpuledger.runs.attempts import chain_runs
    from gpuledger.store.errors import RunNotFound

    chains: dict[str, list[str]] = {}
    for rid in run_ids:
        members = [r for r in chain_runs(ledger, rid) if scope is None or r.labels.get("project") in scope]
        chains[rid] = [r.id for r in members] or [rid]
    wanted = sorted({m for chain in chains.values() for m in chain} | set(run_ids))
    tiered = tiered_intervals(ledger, wanted)  # read through the ledger's series store: per GPU as before the drop
    series = CutDays.of(ledger)  # a series-only run's days with a price change, read from its store
    usage = read(
        ledger,
        lambda conn: collect_runs(
            conn,
            wanted,
            scope=scope,
            instance_type=instance_type,
            cuts=card.change_points,
            tiered=tiered,
            series=series,
        ),
    )
    for rid in run_ids:
        if rid not in usage.runs:
            raise RunNotFound(rid)
    pricer = Pricer(card, basis)
    by_run: dict[str, list[CostLine]] = {}
    for ln in pricer.price_all(usage.usages):
        by_run.setdefault(ln.run_id, []).append(ln)
    out_runs = []
    all_lines: list[CostLine] = []
    for rid in run_ids:
        run = usage.runs[rid]
        lines = by_run.get(rid, [])
        all_lines += lines
        per_gpu: dict[str | None, list[CostLine]] = {}
        for ln in lines:
            per_gpu.setdefault(ln.device_uuid, []).append(ln)
        flag = partial_flag(run.status, run.ended_at)  # an open discovered run is flagged "running"
        demo = bool(run.replayed)
        gpus = [
            _cost_row(rid, ls, usage.devices.get((rid, uuid or "")), flag, demo)
            for uuid, ls in sorted(per_gpu.items(), key=lambda kv: _index_key(usage.devices.get((rid, kv[0] or ""))))
        ]
        chain = chains.get(rid, [rid])
        logical = None
        if len(chain) > 1:
            chain_lines = [ln for member in chain for ln in by_run.get(member, [])]
            chain_demo = any(usage.runs[m].replayed for m in chain if m in usage.runs)
            logical = {**_cost_row(chain[0], chain_lines, None, None, chain_demo), "attempts": chain}
        out_runs.append(
            {
                "run_id": rid,
                "name": run.name,
                "status": run.status,
                "partial": flag is not None,
                "replayed": demo,
                "billed": not demo,
                "gpus": gpus,
                "total": _cost_row(rid, lines, None, flag, demo),
                "logical_run": logical,
            }
        )
    total = _cost_row("TOTAL", all_lines, None, None, any(r["replayed"] for r in out_runs))
    return {
        "currency": card.currency,
        "basis": pricer.basis,
        "rate_card": card.name or card.source,
        "runs": out_runs,
        "total": total,
        "notes": series.notes(),
    }


def _index_key(device: dict[str, Any] | None) -> tuple[int, str]:
    if not device:
        return (1 << 30, "")
    index = device.get("index")
    return (index if isinstance(index, int) else 1 << 30, str(device.get("uuid") or ""))


def run_value(
    ledger: Ledger,
    run_id: str,
    *,
    scope: Scope,
    card: RateCard,
    basis: str | None = None,
    costs: dict[str, Any] | None = None,
) -> ValueForMoney:
    """Value for money of a (YOLO) run, over all attempts of a resumed training. ``costs``: what
    ``run_costs`` gave for this run with the same card, scope and basis (not priced again)."""
    if costs is None:
        costs = run_costs(ledger, [run_id], scope=scope, card=card, basis=basis)
    entry = costs["runs"][0]
    chain = (entry["logical_run"] or {}).get("attempts") or [run_id]
    total = Decimal(entry["logical_run"]["cost"] if entry["logical_run"] else entry["total"]["cost"])
    metrics = [m for rid in chain for m in ledger.metrics(rid)]
    meta: dict[str, Any] = {}
    for rid in chain:  # the last attempt's result wins; the dataset is the same for all
        meta.update({k: v for k, v in ledger.get_run(rid).meta.items() if v})
    return value_for_money(total, **yolo_inputs(meta, metrics), currency=card.currency)


def money(units: int) -> Decimal:
    return money_decimal(units)
