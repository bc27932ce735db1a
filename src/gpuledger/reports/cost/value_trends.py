"""Value for money week by week, with its anomalies and their likely causes (docs/CHARGEBACK.md,
"Value for money over weeks"): what the chargeback HTML and the server's /metrics show.

``run_values`` reads the finished runs that carry a model or model_version label and prices each
as the chargeback does (rolled-up runs from their rollups, the others from their intervals:
run_rollups.py; the card's basis); ``value_trends`` sums them per
group and week (core/chargeback/value_trends.py), finds the weeks that got worse (core/chargeback/anomaly_rule.py) and
explains them: only the runs of a flagged group, in the weeks compared, are diagnosed
(core/diagnosis/diagnose.py), so a report of many weeks reads few runs in full.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuledger.core.chargeback.anomaly_causes import CauseThresholds, explain
from gpuledger.core.chargeback.anomaly_rule import Anomaly, AnomalyRule, find_anomalies
from gpuledger.core.chargeback.value import yolo_inputs
from gpuledger.core.chargeback.value_trends import (
    WEEK_S,
    RunValue,
    group_of,
    map_gain_points,
    series_rows,
    top_lists,
    week_label,
    week_start,
    weekly_cells,
    weeks_before,
)
from gpuledger.core.pricing.cost import Pricer
from gpuledger.core.units import iso_utc
from gpuledger.reports.cost.run_rollups import collect_named, price_named
from gpuledger.store import value_queries as vq

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from gpuledger.core.pricing.ratecard import RateCard
    from gpuledger.store import Ledger

__all__ = ["ValueTrends", "report_weeks", "run_values", "value_trends", "values_of"]

DIAGNOSE_LIMIT = 40  # runs diagnosed per flagged group and week (the newest)
_SETTINGS = ("batch", "imgsz", "workers")


@dataclass
class ValueTrends:
    """Everything the value sections of a report show; ``as_dict`` is JSON-ready."""

    by: str
    currency: str
    weeks: list[float]
    rule: AnomalyRule
    thresholds: CauseThresholds
    series: list[dict[str, Any]]
    tops: dict[str, list[dict[str, Any]]]
    anomalies: list[Anomaly]
    runs: int  # run records counted
    notes: list[str] = field(default_factory=list)
    partial_to: float | None = None  # the last week is counted up to here only (a report's period to date)
    inference: list[dict[str, Any]] = field(default_factory=list)  # evaluation runs' cells: inference_value.py
    inference_anomalies: list[dict[str, Any]] = field(default_factory=list)  # inference_slower, JSON-ready

    @property
    def last_complete(self) -> float:
        """The week the anomalies are about: the last one, or the one before a week cut short."""
        return self.weeks[-2] if self.partial_to is not None and len(self.weeks) > 1 else self.weeks[-1]

    def as_dict(self) -> dict[str, Any]:
        return {
            "by": self.by,
            "currency": self.currency,
            "weeks": [week_label(w) for w in self.weeks],
            "last_week_to": None if self.partial_to is None else iso_utc(self.partial_to),
            "runs": self.runs,
            "anomaly_rule": self.rule.as_dict(),
            "cause_thresholds": dataclasses.asdict(self.thresholds),
            "series": self.series,
            **self.tops,
            "anomalies": [*(a.as_dict(self.by) for a in self.anomalies), *self.inference_anomalies],
            "notes": self.notes,
            "inference": self.inference,
        }


def _setting(meta: Mapping[str, Any], labels: Mapping[str, Any], key: str) -> Any:
    """A hyper-parameter as the YOLO integration records it (meta, then its resolved
    hyperparameters), else a label of that name."""
    hp = meta.get("hyperparameters") if isinstance(meta.get("hyperparameters"), Mapping) else {}
    value = meta.get(key, hp.get(key, labels.get(key)))
    return value if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None


def _name(value: Any) -> str | None:
    if isinstance(value, Mapping):
        value = value.get("name")
    return str(value) if value else None


def _best(meta: Mapping[str, Any], from_metrics: float | None) -> float | None:
    reported = yolo_inputs(meta, [])["map50_95"]  # meta.result.best_map50_95 wins, as in value.py
    return reported if reported is not None else from_metrics


def _read(conn: Connection, rows: Sequence[Mapping[str, Any]], cuts: Sequence[float]) -> Any:
    ids = [r["id"] for r in rows]
    chains = vq.ancestors(conn, rows)
    earlier = sorted({a for chain in chains.values() for a in chain})
    # Unscoped on purpose: the rows are already the reader's; a shared GPU's split needs every tenant.
    # Rolled-up runs are priced from their rollups, as the chargeback prices them (run_rollups.py).
    usage = collect_named(conn, ids, cuts=cuts)
    return vq.metric_figures(conn, ids + earlier), chains, vq.run_meta(conn, earlier), usage


def values_of(
    ledger: Ledger, rows: Sequence[Mapping[str, Any]], *, card: RateCard, basis: str | None = None
) -> list[RunValue]:
    """The value of each run in ``rows`` (store.value_queries.finished_model_runs rows), in order."""
    if not rows:
        return []
    figures, chains, earlier_meta, usage = ledger.read(lambda conn: _read(conn, rows, card.change_points))
    sums: dict[str, list[int]] = {}
    models: dict[str, set[str]] = {}
    for run_id, model, _instance, _month, _t0, v, _flags in price_named(Pricer(card, basis), usage):
        acc = sums.setdefault(run_id, [0, 0, 0, 0, 0])
        acc[0] += v[5]  # cost (AMOUNTS order, core/pricing/cost.py)
        acc[1] += v[6]  # idle cost
        acc[2] += v[0]  # held µh
        acc[3] += v[1]  # busy µh
        acc[4] += v[0] - v[2]  # measured µh: held less unmeasured
        models.setdefault(run_id, set()).add(model)
    out = []
    for row in rows:
        rid, meta, labels = row["id"], row["meta"] or {}, row["labels"] or {}
        best_map, epochs = figures.get(rid, (None, 0))
        best = _best(meta, best_map)
        before = [_best(earlier_meta.get(a, {}), figures.get(a, (None, 0))[0]) for a in chains.get(rid, [])]
        earlier_best = max((b for b in before if b is not None), default=None)
        train = yolo_inputs(meta, [])["train_images"]
        cost, idle, alloc, busy, measured = sums.get(rid, [0, 0, 0, 0, 0])
        settings = {k: _setting(meta, labels, k) for k in _SETTINGS}
        settings["gpu_model"] = ";".join(sorted(models.get(rid, ()))) or None
        settings["dataset"] = labels.get("dataset") or _name(meta.get("dataset"))
        out.append(
            RunValue(
                run_id=rid,
                ended_at=float(row["ended_at"]),
                status=row["status"],
                model=labels.get("model") or _name(meta.get("model")),
                model_version=labels.get("model_version"),
                cost=cost,
                idle_cost=idle,
                alloc_uh=alloc,
                busy_uh=busy,
                measured_uh=measured,
                epochs=epochs,
                images_seen=epochs * train if train else 0,
                map_points=map_gain_points(best, earlier_best),
                map50_95=best,
                settings=settings,
            )
        )
    return out


def run_values(
    ledger: Ledger,
    *,
    scope: frozenset[str] | None,
    card: RateCard,
    start: float,
    end: float,
    basis: str | None = None,
    limit: int | None = None,
    include_replayed: bool = False,
) -> list[RunValue]:
    """The value of every finished, labelled run in scope that ended in [start, end), newest end
    first; runs of a replayed GPU trace (demos, not billed) only with ``include_replayed``."""
    rows = ledger.read(
        lambda conn: vq.finished_model_runs(
            conn, scope=scope, start=start, end=end, limit=limit, replayed=include_replayed
        )
    )
    return values_of(ledger, rows, card=card, basis=basis)


def _findings(ledger: Ledger, run_id: str) -> frozenset[str] | None:
    """The rules the diagnosis of ``run_id`` found (None when the run is gone)."""
    from gpuledger.core.diagnosis.diagnose import diagnose
    from gpuledger.reports.run import data as rundata
    from gpuledger.store.errors import RunNotFound

    try:
        run = ledger.get_run(run_id)
    except RunNotFound:
        return None
    data = rundata.load(ledger, run)
    return frozenset(f.rule for f in diagnose(rundata.trace_of(ledger, data, with_history=False)))


def _diagnosed(ledger: Ledger, runs: Sequence[RunValue], limit: int) -> list[RunValue]:
    """The newest ``limit`` of ``runs`` with their findings (the runs the finding causes compare)."""
    out = []
    for r in sorted(runs, key=lambda r: (-r.ended_at, r.run_id))[:limit]:
        found = _findings(ledger, r.run_id)
        if found is not None:
            out.append(dataclasses.replace(r, findings=found, diagnosed=True))
    return out


def report_weeks(since: float, end: float, weeks: int = 8) -> tuple[list[float], bool]:
    """The week starts a report of [since, end) shows, oldest first: every week that holds part of
    the period, and at least ``weeks`` of them (a baseline for the anomalies); and whether the last
    is cut short by ``end`` (a December report made on December 4th ends with December's first
    days, not with a week of November)."""
    if weeks < 1:
        raise ValueError("value trends need at least one week")
    last = week_start(max(since, end - 1e-6))
    first = min(week_start(since), last - (weeks - 1) * WEEK_S)
    n = round((last - first) / WEEK_S) + 1
    return [last - (n - 1 - i) * WEEK_S for i in range(n)], last + WEEK_S > end


def value_trends(
    ledger: Ledger,
    *,
    scope: frozenset[str] | None,
    card: RateCard,
    end: float,
    weeks: int = 8,
    since: float | None = None,
    by: str = "model_version",
    basis: str | None = None,
    top_n: int = 10,
    rule: AnomalyRule | None = None,
    thresholds: CauseThresholds | None = None,
    diagnose_limit: int = DIAGNOSE_LIMIT,
    include_replayed: bool = False,
) -> ValueTrends:
    """The ``weeks`` complete ISO weeks before ``end``: series, TOP lists, anomalies of the last.
    With ``since`` (a report's period [since, end)): the weeks of ``report_weeks``, the last one
    counted up to ``end`` only; the anomalies are still those of the last complete week.
    Runs of a replayed GPU trace count only with ``include_replayed``, as in the chargeback."""
    rule = rule or AnomalyRule()
    thresholds = thresholds or CauseThresholds()
    if weeks < 1:
        raise ValueError("value trends need at least one week")
    partial = False
    if since is None:
        starts = weeks_before(end, weeks)
    else:
        starts, partial = report_weeks(since, end, weeks)
    complete = starts[:-1] if partial else starts
    values = run_values(
        ledger, scope=scope, card=card, basis=basis, start=starts[0], end=end if partial else starts[-1] + WEEK_S,
        include_replayed=include_replayed,
    )  # fmt: skip
    cells = weekly_cells(values, starts, by)
    anomalies = find_anomalies({k: c for k, c in cells.items() if k[1] in set(complete)}, complete, rule)
    diagnosed: dict[str, RunValue] = {}
    for a in anomalies:
        now, before = _split(values, a, by)
        for week_runs in (now, *_by_week(before)):
            for r in _diagnosed(ledger, [r for r in week_runs if r.run_id not in diagnosed], diagnose_limit):
                diagnosed[r.run_id] = r
        explain(
            a,
            [diagnosed.get(r.run_id, r) for r in now],
            [diagnosed.get(r.run_id, r) for r in before],
            currency=card.currency,
            th=thresholds,
        )
    notes = []
    if partial:
        notes.append(f"{week_label(starts[-1])} is counted up to {iso_utc(end)}; anomalies compare complete weeks")
    if len(complete) <= rule.baseline_weeks:
        notes.append(f"anomalies need {rule.baseline_weeks + 1} weeks or more (the week and those it is compared with)")
    return ValueTrends(
        by=by,
        currency=card.currency,
        weeks=starts,
        rule=rule,
        thresholds=thresholds,
        series=series_rows(cells, starts, by),
        tops=top_lists(cells, by, top_n),
        anomalies=anomalies,
        runs=sum(c.runs for c in cells.values()),
        notes=notes,
        partial_to=end if partial else None,
        inference=_inference(ledger, by, scope, card, starts, end, basis, include_replayed),
        inference_anomalies=_slower(ledger, by, scope, starts, end, include_replayed),
    )


def _inference(ledger: Ledger, by: str, scope: frozenset[str] | None, card: RateCard, starts: list[float],
               end: float, basis: str | None, include_replayed: bool) -> list[dict[str, Any]]:  # fmt: skip
    """Cost per 1,000 images and J/image of evaluation runs, by model_version only (issue 37)."""
    from gpuledger.reports.cost.inference_value import inference_value

    if by != "model_version":
        return []
    last = min(end, starts[-1] + WEEK_S)
    return inference_value(ledger, scope=scope, card=card, weeks=starts, end=last, basis=basis,
                           include_replayed=include_replayed)  # fmt: skip


def _slower(ledger: Ledger, by: str, scope: frozenset[str] | None, starts: list[float], end: float,
            include_replayed: bool) -> list[dict[str, Any]]:  # fmt: skip
    """Versions evaluated in the weeks whose inference is slower than their previous version's (issue 37)."""
    from gpuledger.reports.cost.inference_value import slower_anomalies

    if by != "model_version":
        return []
    last = min(end, starts[-1] + WEEK_S)
    return slower_anomalies(ledger, scope=scope, weeks=starts, end=last, by=by, include_replayed=include_replayed)


def _split(values: Sequence[RunValue], a: Anomaly, by: str) -> tuple[list[RunValue], list[RunValue]]:
    """The anomaly's group: its runs of the week, and of the baseline weeks."""
    mine = [r for r in values if group_of(r, by) == a.group]
    baseline = set(a.baseline_weeks)
    return (
        [r for r in mine if week_start(r.ended_at) == a.week],
        [r for r in mine if week_start(r.ended_at) in baseline],
    )


def _by_week(runs: Sequence[RunValue]) -> list[list[RunValue]]:
    out: dict[float, list[RunValue]] = {}
    for r in runs:
        out.setdefault(week_start(r.ended_at), []).append(r)
    return [out[w] for w in sorted(out)]
