"""Rendering cost and chargeback reports: terminal table, CSV, Markdown, JSON. (HTML: chargeback_html.)

Machine formats (CSV, JSON) carry exactly the documented columns (core/chargeback/columns.py,
docs/CHARGEBACK.md); money stays an exact decimal string. People's formats round money to cents.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from gpuledger.core.chargeback.columns import COLUMNS, group_columns
from gpuledger.core.chargeback.report import Chargeback
from gpuledger.core.ids import short_id
from gpuledger.core.money import money_str
from gpuledger.core.units import NA, fmt_count, fmt_money, fmt_number, fmt_pct
from gpuledger.reports.render_md import esc
from gpuledger.reports.safe_csv import SafeCsvWriter, numeric_columns

__all__ = ["SECTIONS", "chargeback_csv", "chargeback_markdown", "chargeback_text", "cost_csv", "cost_text", "to_json"]

# CSV sections: name -> (attribute of Chargeback, columns key, prefixed by the group keys)
SECTIONS: dict[str, tuple[str, str, bool]] = {
    "groups": ("groups", "groups", True),
    "runs": ("top_runs_by_cost", "runs", False),
    "idle-runs": ("top_runs_by_idle_cost", "runs", False),
    "users": ("top_users_by_cost", "users", False),
    "idle-users": ("top_users_by_idle_cost", "users", False),
    "trend": ("trend", "trend", True),
    "anomalies": ("anomalies", "anomalies", True),
}


def to_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2) + "\n"


def section_columns(cb: Chargeback, section: str) -> list[str]:
    _, key, grouped = SECTIONS[section]
    lead = [c.name for c in group_columns(tuple(cb.params.get("by", ())))] if grouped else []
    return lead + [c.name for c in COLUMNS[key]] + (shared_idle_columns(cb) if section == "groups" else [])


def shared_idle_columns(cb: Chargeback) -> list[str]:
    """The columns ``--share-idle`` adds to the groups (docs/CAPACITY.md); none without it."""
    return list(SHARED_IDLE_COLUMNS) if cb.params.get("share_idle") not in (None, "none") else []


SHARED_IDLE_COLUMNS = ("shared_idle_cost", "cost_with_shared_idle")
_MONEY_COLUMNS = ("cost", "idle_cost", "energy_cost", "cost_per_a100eq_h", *SHARED_IDLE_COLUMNS)


def section_rows(cb: Chargeback, section: str) -> list[dict[str, Any]]:
    attr = SECTIONS[section][0]
    rows = list(getattr(cb, attr))
    return [*rows, cb.total] if section == "groups" else rows


# Columns whose decimal strings are numbers (money "-1.50"): a CSV cell there is not a formula.
_NUMERIC = numeric_columns(c for cols in COLUMNS.values() for c in cols) | set(SHARED_IDLE_COLUMNS)


def _csv(columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> str:
    """Text cells that a spreadsheet would take as a formula are neutralised (reports/safe_csv.py)."""
    buf = io.StringIO()
    writer = SafeCsvWriter(buf, columns, _NUMERIC)
    writer.writerows([row.get(c) for c in columns] for row in rows)
    return buf.getvalue()


def chargeback_csv(cb: Chargeback, section: str = "groups") -> str:
    return _csv(section_columns(cb, section), section_rows(cb, section))


def cost_csv(report: dict[str, Any]) -> str:
    columns = [c.name for c in COLUMNS["cost"]]
    rows = []
    for run in report["runs"]:
        rows += run["gpus"]
        rows.append(run["total"])
        if run["logical_run"]:
            rows.append(run["logical_run"])
    rows.append(report["total"])
    return _csv(columns, rows)


# -- for people ------------------------------------------------------------------------------------

_MONTH = re.compile(r"\d{4}-\d{2}")  # trend pivot columns hold a month's cost
_SHORT = {
    "runs": "RUNS",
    "allocated_gpu_h": "ALLOC GPU-H",
    "busy_gpu_h": "BUSY GPU-H",
    "idle_gpu_h": "IDLE GPU-H",
    "mean_utilization": "UTIL",
    "a100eq_h": "A100-EQ H",
    "energy_kwh": "KWH",
    "cost": "COST",
    "idle_cost": "IDLE COST",
    "cost_per_a100eq_h": "PER A100-H",
    "share": "SHARE",
    "replayed_runs": "REPLAYED",
    "shared_idle_cost": "SHARED IDLE",
    "cost_with_shared_idle": "WITH IDLE",
}


def _cell(column: str, value: Any) -> str:
    """One cell for people (core/units.py): money in cents, shares in percent, quantities with
    three significant digits; machine formats keep the exact values."""
    if value is None:
        return NA
    if column in _MONEY_COLUMNS or _MONTH.fullmatch(column):
        return fmt_money(value)
    if column in ("mean_utilization", "share", "idle_share", "change"):
        return fmt_pct(float(value))
    if column == "run_id":
        return short_id(str(value))
    if isinstance(value, float):
        return fmt_number(value)
    return str(value)


def _table(
    columns: Sequence[str], rows: Sequence[dict[str, Any]], headers: dict[str, str] | None = None
) -> list[list[str]]:
    headers = headers or {}
    out = [[headers.get(c, _SHORT.get(c, c.upper())) for c in columns]]
    out += [[_cell(c, r.get(c)) for c in columns] for r in rows]
    return out


ALIGN_MAX = 40  # piped or in a file: a longer cell (a 10 kB team name) pushes its own line, not every line


def _plain_table(table: list[list[str]], indent: str = "  ") -> str:
    widths = [min(ALIGN_MAX, max(len(row[i]) for row in table)) for i in range(len(table[0]))]
    lines = []
    for n, row in enumerate(table):
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [c.ljust(w) if i == 0 or not _numeric(c) else c.rjust(w) for i, (c, w) in pairs]
        lines.append(indent + "  ".join(cells).rstrip())
        if n == 0:
            lines.append(indent + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _numeric(cell: str) -> bool:
    return bool(cell) and (cell[0].isdigit() or cell[0] in "-—<>") and cell != "-"


_GROUP_VIEW = [
    "runs",
    "allocated_gpu_h",
    "busy_gpu_h",
    "idle_gpu_h",
    "mean_utilization",
    "a100eq_h",
    "energy_kwh",
    "cost",
    "idle_cost",
    "cost_per_a100eq_h",
    "share",
]
_RUN_VIEW = [
    "rank",
    "run_id",
    "user",
    "team",
    "status",
    "attempts",
    "gpu_models",
    "allocated_gpu_h",
    "busy_gpu_h",
    "mean_utilization",
    "cost",
    "idle_cost",
    "flags",
]
_USER_VIEW = ["rank", "user", "runs", "allocated_gpu_h", "busy_gpu_h", "mean_utilization", "cost", "idle_cost"]


def _period(p: dict[str, Any]) -> str:
    """'2026-03' for a whole month, else 'from -> to' (UTC)."""
    start, end = str(p.get("from") or ""), str(p.get("to") or "")
    months = p.get("trend_months") or []
    if start.endswith("-01T00:00:00Z") and end.endswith("-01T00:00:00Z") and months and start[:7] == months[-1]:
        return start[:7]
    return f"{start} -> {end}"


def _title(cb: Chargeback) -> str:
    p = cb.params
    scope = "all projects" if p.get("scope") is None else "projects " + ", ".join(p["scope"])
    demo = "; INCLUDES REPLAYED RUNS (not real hardware)" if p.get("include_replayed") else ""
    return (
        f"Chargeback {_period(p)} by {', '.join(p.get('by', []))}  "
        f"({scope}; basis {p.get('basis')}; {p.get('currency')}; rate card: {p.get('rate_card')}{demo})"
    )


def _group_view(cb: Chargeback) -> list[str]:
    """The groups' columns for people: with --include-replayed, how many replayed runs each holds."""
    demo = ["replayed_runs"] if cb.params.get("include_replayed") else []
    return list(cb.params.get("by", [])) + _GROUP_VIEW + demo + shared_idle_columns(cb)


def _trend_pivot(cb: Chargeback) -> tuple[list[str], list[dict[str, Any]]]:
    by = list(cb.params.get("by", []))
    months = list(cb.params.get("trend_months", []))
    pivot: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in cb.trend:
        key = tuple(row.get(k) for k in by)
        entry = pivot.setdefault(key, {k: row.get(k) for k in by})
        entry[row["month"]] = row["cost"]
    for entry in pivot.values():  # a month a group used nothing in cost it nothing (n/a: not known)
        for month in months:
            entry.setdefault(month, money_str(0))
    return by + months, list(pivot.values())


Grid = Callable[[list[list[str]]], str]  # a table (header row first) as text; the CLI's fits the terminal


def chargeback_text(cb: Chargeback, top: int = 5, table: Grid | None = None) -> str:
    """The report for a terminal: groups with TOTAL, top spenders, trend, anomalies, warnings."""
    _plain = table or _plain_table
    by = list(cb.params.get("by", []))
    parts = [_title(cb), "", _plain(_table(_group_view(cb), [*cb.groups, cb.total]))]
    for title, rows, view in (
        ("Top runs by cost", cb.top_runs_by_cost, _RUN_VIEW),
        ("Top runs by idle cost", cb.top_runs_by_idle_cost, _RUN_VIEW),
        ("Top users by cost", cb.top_users_by_cost, _USER_VIEW),
        ("Top users by idle cost", cb.top_users_by_idle_cost, _USER_VIEW),
    ):
        if rows:
            parts += ["", title, _plain(_table(view, rows[:top]))]
    columns, rows = _trend_pivot(cb)
    if len(columns) > len(by) + 1:
        parts += [
            "",
            f"Cost by month ({cb.params.get('currency')})",
            _plain(_table(columns, rows, {m: m for m in columns[len(by) :]})),
        ]
    if cb.anomalies:
        parts += [
            "",
            f"Anomalies (rise above {float(cb.params.get('anomaly_threshold', 0)) * 100:.0f}% vs earlier months)",
        ]
        parts.append(_plain(_table([*by, "metric", "baseline", "current", "change"], cb.anomalies)))
    if cb.warnings:
        parts += ["", "Notes"] + [f"  - {w}" for w in cb.warnings]
    return "\n".join(parts) + "\n"


def _md(columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> str:
    table = _table(columns, rows)
    lines = ["| " + " | ".join(table[0]) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in table[1:]]
    return "\n".join(lines)


def chargeback_markdown(cb: Chargeback, top: int = 10) -> str:
    by = list(cb.params.get("by", []))
    out = [f"# {esc(_title(cb))}", "", _md(_group_view(cb), [*cb.groups, cb.total])]
    for title, rows, view in (
        ("Top runs by cost", cb.top_runs_by_cost, _RUN_VIEW),
        ("Top runs by idle cost", cb.top_runs_by_idle_cost, _RUN_VIEW),
        ("Top users by cost", cb.top_users_by_cost, _USER_VIEW),
        ("Top users by idle cost", cb.top_users_by_idle_cost, _USER_VIEW),
    ):
        if rows:
            out += ["", f"## {title}", "", _md(view, rows[:top])]
    columns, rows = _trend_pivot(cb)
    out += ["", f"## Cost by month ({esc(cb.params.get('currency'))})", "", _md(columns, rows)]
    if cb.anomalies:
        out += ["", "## Anomalies", "", _md([*by, "metric", "baseline", "current", "change"], cb.anomalies)]
    if cb.warnings:
        out += ["", "## Notes", ""] + [f"- {esc(w)}" for w in cb.warnings]
    return "\n".join(out) + "\n"


_COST_VIEW = [
    "run_id",
    "gpu_index",
    "gpu_model",
    "rate",
    "allocated_gpu_h",
    "busy_gpu_h",
    "idle_gpu_h",
    "mean_utilization",
    "a100eq_h",
    "energy_kwh",
    "cost",
    "idle_cost",
    "flags",
]


def cost_text(report: dict[str, Any], table: Grid | None = None) -> str:
    _plain = table or _plain_table
    rows: list[dict[str, Any]] = []
    for run in report["runs"]:
        for g in run["gpus"]:
            rows.append({**g, "run_id": ""})
        rows.append({**run["total"], "run_id": run["run_id"], "gpu_index": "all"})
        if run["logical_run"]:
            n = len(run["logical_run"]["attempts"])
            rows.append({**run["logical_run"], "run_id": fmt_count(n, "attempt"), "gpu_index": "all"})
    if len(report["runs"]) > 1:
        rows.append({**report["total"], "gpu_index": ""})
    head = f"Cost (basis {report['basis']}; {report['currency']}; rate card: {report['rate_card']})"
    notes = [
        f"  {short_id(run['run_id'])}: REPLAYED GPU trace (--replay-gpus), not real hardware: "
        "these figures are not billed (no chargeback counts them)"
        for run in report["runs"]
        if run.get("replayed")
    ]
    notes += [f"  {n}" for n in report.get("notes", [])]
    text = _plain(_table(_COST_VIEW, rows, {"gpu_index": "GPU"}))
    return head + "\n" + text + "\n" + "".join(n + "\n" for n in notes)
