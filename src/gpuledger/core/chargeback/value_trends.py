"""Value for money week by week: cost per epoch, per 1,000 training images and per mAP50-95 point
by model_version (or model), and the TOP lists of the manager's dashboard. Pure: no I/O, no clock.

A run record (an attempt of a resumed training counts on its own) belongs to the ISO week (Monday
00:00 UTC) it ended in, with its whole cost; runs still recording belong to no week yet. A group's
figure for a week is a ratio of sums: Σ cost of the group's runs / Σ what they produced (epochs,
images seen, mAP50-95 points gained). A failed run adds its cost and little or nothing to the
divisor, so failures make the figures worse, as they do for the budget.

mAP points *gained*: a first attempt gains its best mAP50-95 x 100; a resumed attempt gains what
it added to the best of the attempts before it (never negative). The gains of a training's
attempts add up to its best mAP, so splitting it into attempts never counts a point twice.

Money stays exact: costs are integer 10^-21 units (money.py); the ratios are Decimal, rounded
half-even to 6 places like core/chargeback/value.py.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from gpuledger.core.money import EXACT, MONEY_SCALE, UH_PER_H, money_str

__all__ = [
    "FAILED_STATUSES",
    "GROUP_BY",
    "METRICS",
    "WEEK_S",
    "Cell",
    "RunValue",
    "group_of",
    "map_gain_points",
    "series_rows",
    "top_lists",
    "week_label",
    "week_start",
    "weekly_cells",
    "weeks_before",
]

WEEK_S = 7 * 86400
_MONDAY = 4 * 86400  # 1970-01-05 00:00 UTC, the first Monday after the epoch
GROUP_BY = ("model_version", "model")
METRICS = ("cost_per_map_point", "cost_per_epoch", "cost_per_1k_images")
FAILED_STATUSES = frozenset({"failed", "killed", "lost"})
_Q = Decimal("0.000001")
_HUNDRED = Decimal(100)


def week_start(t: float) -> float:
    """The Monday 00:00 UTC that starts the ISO week holding ``t``."""
    return math.floor((t - _MONDAY) / WEEK_S) * WEEK_S + _MONDAY


def week_label(start: float) -> str:
    """ISO week of a week start: "2026-W10"."""
    year, week, _ = dt.datetime.fromtimestamp(start, tz=dt.timezone.utc).isocalendar()
    return f"{year:04d}-W{week:02d}"


def weeks_before(end: float, n: int) -> list[float]:
    """The starts of the ``n`` complete weeks before ``end``, oldest first: the last one ends at or
    before ``end`` (a report ending on a Wednesday has last week as its last week)."""
    last = week_start(end) - WEEK_S  # end on a Monday 00:00: the week that just ended
    return [last - (n - 1 - i) * WEEK_S for i in range(n)]


def map_gain_points(best: float | None, earlier_best: float | None) -> Decimal:
    """mAP50-95 percentage points an attempt added to the best of the attempts before it (0-1
    figures in, points out; missing or non-finite figures count as nothing, a loss as 0)."""

    def exact(v: float | None) -> Decimal:
        return Decimal(repr(v)) if v is not None and math.isfinite(v) and v > 0 else Decimal(0)

    now, before = exact(best), exact(earlier_best)
    return (max(now, before) - before) * _HUNDRED


@dataclass(frozen=True)
class RunValue:
    """What one finished run record cost and produced, and what the anomaly causes compare."""

    run_id: str
    ended_at: float
    status: str
    model: str | None  # label ``model`` (the YOLO integration fills it), else meta.model.name
    model_version: str | None  # label ``model_version``
    cost: int  # money units (10^-21 of the currency)
    idle_cost: int = 0
    alloc_uh: int = 0  # held micro-GPU-hours
    busy_uh: int = 0
    measured_uh: int = 0  # held time of GPUs that report utilisation (busy share's divisor)
    epochs: int = 0
    images_seen: int = 0  # epochs x training images per epoch; 0 when unknown
    map_points: Decimal = Decimal(0)  # mAP50-95 points gained (map_gain_points)
    map50_95: float | None = None  # the attempt's best mAP50-95 (0-1); None: no mAP recorded
    settings: Mapping[str, Any] = field(default_factory=dict)  # batch, imgsz, workers, gpu_model, dataset
    findings: frozenset[str] = frozenset()  # diagnosis rules that fired, when ``diagnosed``
    diagnosed: bool = False  # the diagnosis read this run (only runs a cause compares are read)

    @property
    def failed(self) -> bool:
        return self.status in FAILED_STATUSES


def group_of(run: RunValue, by: str) -> str | None:
    """The run's group: its model_version label, falling back to its model (a YOLO run is labelled
    with its model automatically, a model_version only when someone says so); or its model."""
    if by == "model_version":
        return run.model_version or run.model
    if by == "model":
        return run.model
    raise ValueError(f"group value trends by one of {', '.join(GROUP_BY)} (got {by!r})")


@dataclass
class Cell:
    """Exact sums of one group's runs in one week (or over the whole window)."""

    runs: int = 0
    failed: int = 0
    cost: int = 0
    idle_cost: int = 0
    alloc_uh: int = 0
    busy_uh: int = 0
    measured_uh: int = 0
    epochs: int = 0
    images_seen: int = 0
    map_points: Decimal = Decimal(0)
    run_ids: list[str] = field(default_factory=list)

    def add(self, r: RunValue) -> None:
        self.runs += 1
        self.failed += r.failed
        self.cost += r.cost
        self.idle_cost += r.idle_cost
        self.alloc_uh += r.alloc_uh
        self.busy_uh += r.busy_uh
        self.measured_uh += r.measured_uh
        self.epochs += r.epochs
        self.images_seen += r.images_seen
        self.map_points += r.map_points
        self.run_ids.append(r.run_id)

    def merge(self, other: Cell) -> None:
        for name in ("runs", "failed", "cost", "idle_cost", "alloc_uh", "busy_uh", "measured_uh", "epochs"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.images_seen += other.images_seen
        self.map_points += other.map_points
        self.run_ids += other.run_ids

    def per(self, divisor: Decimal | int) -> Decimal | None:
        """Cost / divisor, rounded half-even to 6 places; None without a positive divisor."""
        if divisor <= 0:
            return None
        amount = Decimal(self.cost).scaleb(-MONEY_SCALE, EXACT)
        return EXACT.divide(amount, Decimal(divisor)).quantize(_Q, ROUND_HALF_EVEN, EXACT)

    def metric(self, name: str) -> Decimal | None:
        if name == "cost_per_map_point":
            return self.per(self.map_points)
        if name == "cost_per_epoch":
            return self.per(self.epochs)
        if name == "cost_per_1k_images":
            return None if self.images_seen <= 0 else self.per(Decimal(self.images_seen) / 1000)
        raise ValueError(f"unknown value metric {name!r}")

    def busy_share(self) -> float | None:
        return None if self.measured_uh <= 0 else round(self.busy_uh / self.measured_uh, 6)

    def columns(self) -> dict[str, Any]:
        """JSON-ready figures: money as exact decimal strings, hours rounded to 6 places."""

        def s(v: Decimal | None) -> str | None:
            return None if v is None else format(v, "f")

        return {
            "runs": self.runs,
            "failed_runs": self.failed,
            "cost": money_str(self.cost),
            "idle_cost": money_str(self.idle_cost),
            "allocated_gpu_h": round(self.alloc_uh / UH_PER_H, 6),
            "busy_share": self.busy_share(),
            "epochs": self.epochs,
            "images_seen": self.images_seen,
            "map_points": float(self.map_points),
            "cost_per_epoch": s(self.metric("cost_per_epoch")),
            "cost_per_1k_images": s(self.metric("cost_per_1k_images")),
            "cost_per_map_point": s(self.metric("cost_per_map_point")),
        }


def weekly_cells(
    runs: Iterable[RunValue], weeks: Sequence[float], by: str = "model_version"
) -> dict[tuple[str, float], Cell]:
    """(group, week start) -> the sums of the group's runs that ended in that week. Runs outside
    the weeks, and runs without a group (no model or model_version), are left out."""
    wanted = set(weeks)
    cells: dict[tuple[str, float], Cell] = {}
    for r in runs:
        group = group_of(r, by)
        week = week_start(r.ended_at)
        if group is None or week not in wanted:
            continue
        cells.setdefault((group, week), Cell()).add(r)
    return cells


def series_rows(cells: Mapping[tuple[str, float], Cell], weeks: Sequence[float], by: str) -> list[dict[str, Any]]:
    """One row per group and week with runs, groups in name order, weeks oldest first."""
    groups = sorted({g for g, _ in cells})
    rows = []
    for group in groups:
        for week in weeks:
            cell = cells.get((group, week))
            if cell is not None:
                rows.append({by: group, "week": week_label(week), **cell.columns()})
    return rows


def totals(cells: Mapping[tuple[str, float], Cell]) -> dict[str, Cell]:
    """group -> the sums over all its weeks."""
    out: dict[str, Cell] = {}
    for (group, _), cell in cells.items():
        out.setdefault(group, Cell()).merge(cell)
    return out


def top_lists(cells: Mapping[tuple[str, float], Cell], by: str, n: int = 10) -> dict[str, list[dict[str, Any]]]:
    """Over the whole window: the groups that cost most, those with the worst (highest) cost per
    mAP point, and those with the most idle cost; ties go to the group name."""
    per_group = totals(cells)

    def ranked(key, keep) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
        chosen = sorted((g for g, c in per_group.items() if keep(c)), key=lambda g: (key(per_group[g]), g))[:n]
        return [{"rank": i, by: g, **per_group[g].columns()} for i, g in enumerate(chosen, 1)]

    return {
        "top_by_cost": ranked(lambda c: -c.cost, lambda c: c.cost > 0),
        "top_by_cost_per_map_point": ranked(
            lambda c: -c.metric("cost_per_map_point"), lambda c: c.metric("cost_per_map_point") is not None
        ),
        "top_by_idle_cost": ranked(lambda c: -c.idle_cost, lambda c: c.idle_cost > 0),
    }
