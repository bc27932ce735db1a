"""Rendering the capacity report and the fleet: terminal table, CSV, Markdown, one offline HTML
file (inline SVG, no script, the report's JSON embedded; a Content-Security-Policy allows only its own
style sheet), JSON.

Machine formats carry exactly the documented columns (core/capacity/columns.py, docs/CAPACITY.md)
with money as exact decimal strings; people's formats round money to cents.
"""

from __future__ import annotations

import html
import io
import json
from collections.abc import Callable, Sequence
from typing import Any

from gpuledger.core.capacity.columns import COLUMNS
from gpuledger.core.capacity.report import CapacityReport
from gpuledger.core.units import NA, fmt_money, fmt_number, fmt_pct
from gpuledger.reports.render_md import esc
from gpuledger.reports.safe_csv import SafeCsvWriter, numeric_columns
from gpuledger.reports.safe_html import csp_meta, json_block
from gpuledger.reports.svg import CHAR_W, legend

__all__ = [
    "capacity_csv",
    "capacity_html",
    "capacity_markdown",
    "capacity_text",
    "fleet_csv",
    "fleet_markdown",
    "fleet_text",
    "to_json",
]

_MONEY = {c.name for cols in COLUMNS.values() for c in cols if c.unit == "currency"}
_RATIO = {c.name for cols in COLUMNS.values() for c in cols if c.unit == "ratio"}
_VIEW = [
    "gpus",
    "fleet_gpu_h",
    "unallocated_gpu_h",
    "alloc_idle_gpu_h",
    "busy_attributed_gpu_h",
    "busy_unattributed_gpu_h",
    "unobserved_gpu_h",
    "busy_share",
    "asset_cost",
    "unallocated_cost",
    "alloc_idle_cost",
    "busy_attributed_cost",
    "busy_unattributed_cost",
    "unobserved_cost",
    "energy_cost",
    "fleet_cost",
]
_SHORT = {
    "gpus": "GPUS",
    "fleet_gpu_h": "FLEET GPU-H",
    "unallocated_gpu_h": "UNALLOC",
    "alloc_idle_gpu_h": "ALLOC IDLE",
    "busy_attributed_gpu_h": "BUSY OWNED",
    "busy_unattributed_gpu_h": "BUSY NO OWNER",
    "unobserved_gpu_h": "UNOBSERVED",
    "busy_share": "BUSY",
    "asset_cost": "ASSET COST",
    "unallocated_cost": "UNALLOC COST",
    "alloc_idle_cost": "IDLE COST",
    "busy_attributed_cost": "OWNED COST",
    "busy_unattributed_cost": "NO-OWNER COST",
    "unobserved_cost": "UNOBS COST",
    "energy_cost": "ENERGY",
    "fleet_cost": "FLEET COST",
    "allocated_gpu_h": "ALLOC GPU-H",
    "busy_gpu_h": "BUSY GPU-H",
    "weight": "WEIGHT",
    "billed_cost": "BILLED",
    "shared_idle_cost": "SHARED IDLE",
    "total_cost": "TOTAL",
}
_SHARE_VIEW = [c.name for c in COLUMNS["shares"]]
_FLEET_VIEW = ["gpu", "gpu_model", "host", "hosts", "pool", "rate", "first_seen", "last_seen", "status", "source"]
RULES_IN_WORDS = {
    "none": "not shared: the fleet's owner carries the cost no run was billed for",
    "allocated": "shared in proportion to each team's allocated GPU-hours",
    "busy": "shared in proportion to each team's busy GPU-hours",
}


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2) + "\n"


def _cell(column: str, value: Any) -> str:
    if value is None:
        return NA
    if column in _MONEY:
        return fmt_money(value)
    if column in _RATIO:
        return fmt_pct(float(value))
    if isinstance(value, float):
        return fmt_number(value)
    return str(value)


def _grid(columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> list[list[str]]:
    return [[_SHORT.get(c, c.upper()) for c in columns], *([_cell(c, r.get(c)) for c in columns] for r in rows)]


Grid = Callable[[list[list[str]]], str]  # a table (header row first) as text; the CLI's fits the terminal


ALIGN_MAX = 40  # piped or in a file: a longer cell (a 10 kB pool or host name) pushes its own line only


def _plain_table(table: list[list[str]]) -> str:
    widths = [min(ALIGN_MAX, max(len(row[i]) for row in table)) for i in range(len(table[0]))]
    lines = []
    for n, row in enumerate(table):
        cells = [
            c.ljust(w) if i == 0 or not c[:1].isdigit() else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  " + "  ".join(cells).rstrip())
        if n == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _md(columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> str:
    table = _grid(columns, rows)
    out = ["| " + " | ".join(table[0]) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in table[1:]]
    return "\n".join(out)


_NUMERIC = numeric_columns(c for cols in COLUMNS.values() for c in cols)  # money strings stay numbers


def _csv(columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> str:
    """Text cells that a spreadsheet would take as a formula are neutralised (reports/safe_csv.py)."""
    buf = io.StringIO()
    writer = SafeCsvWriter(buf, columns, _NUMERIC)
    writer.writerows([row.get(c) for c in columns] for row in rows)
    return buf.getvalue()


def title(report: CapacityReport) -> str:
    p = report.params
    period = p.get("month") or f"{p.get('from')} -> {p.get('to')}"
    return (
        f"Capacity {period} by {', '.join(p.get('by', []))}  ({report.total.get('gpus', 0)} GPUs; "
        f"{p.get('currency')}; rate card: {p.get('rate_card')}; pools: {p.get('pools') or 'by instance type or model'})"
    )


def _rule_line(report: CapacityReport) -> str:
    rule = str(report.params.get("share_idle", "none"))
    return f"Idle cost rule: {rule} — {RULES_IN_WORDS.get(rule, rule)}"


def capacity_csv(report: CapacityReport, section: str = "groups") -> str:
    """One section: ``groups`` (the --by keys lead, then TOTAL) or ``shares``."""
    if section == "shares":
        rows = [*report.shares, *([report.shares_total] if report.shares_total else [])]
        return _csv(_SHARE_VIEW, rows)
    by = list(report.params.get("by", []))
    return _csv(by + [c.name for c in COLUMNS["groups"]], [*report.groups, report.total])


def capacity_text(report: CapacityReport, table: Grid | None = None) -> str:
    _plain = table or _plain_table
    by = list(report.params.get("by", []))
    parts = [title(report), _rule_line(report), "", _plain(_grid(by + _VIEW, [*report.groups, report.total]))]
    if report.shares_total is not None:
        parts += ["", "Shared back to teams", _plain(_grid(_SHARE_VIEW, [*report.shares, report.shares_total]))]
    if report.warnings:
        parts += ["", "Notes", *(f"  - {w}" for w in report.warnings)]
    return "\n".join(parts) + "\n"


def capacity_markdown(report: CapacityReport) -> str:
    by = list(report.params.get("by", []))
    out = [f"# {esc(title(report))}", "", f"**{esc(_rule_line(report))}**", ""]
    out.append(_md(by + _VIEW, [*report.groups, report.total]))
    if report.shares_total is not None:
        out += ["", "## Shared back to teams", "", _md(_SHARE_VIEW, [*report.shares, report.shares_total])]
    if report.warnings:
        out += ["", "## Notes", "", *(f"- {esc(w)}" for w in report.warnings)]
    return "\n".join(out) + "\n"


# -- HTML -------------------------------------------------------------------------------------------

_STATE_BARS = (  # (column, label, colour)
    ("busy_attributed_gpu_h", "busy, owner found", "#3ca951"),
    ("busy_unattributed_gpu_h", "busy, no owner", "#efb118"),
    ("alloc_idle_gpu_h", "allocated, idle", "#ff725c"),
    ("unallocated_gpu_h", "unallocated", "#9498a0"),
    ("unobserved_gpu_h", "unobserved", "#d9d9de"),
)
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;
color:#1d1d1f;padding:0 16px}h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0;font-variant-numeric:tabular-nums;font-size:13px}
th,td{padding:3px 6px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th{background:#f6f6f8;font-weight:600;white-space:normal;vertical-align:bottom}
td:first-child,th:first-child{text-align:left}td.name{text-align:left;white-space:normal;word-break:keep-all}
tr.total td{font-weight:700;border-top:2px solid #999}.rule{font-weight:600}.note{color:#666}.wide{overflow-x:auto}
svg{max-width:100%;height:auto}svg text{font:11px system-ui,sans-serif;fill:#333}svg text.title{font-weight:600}
"""
# The groups' columns in two tables that each fit a laptop's width: GPU-hours by state, then money.
_HOURS_VIEW = _VIEW[: _VIEW.index("asset_cost")]
_MONEY_VIEW = _VIEW[_VIEW.index("asset_cost") :]


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _html_table(
    columns: Sequence[str],
    rows: Sequence[dict[str, Any]],
    total: dict[str, Any] | None,
    names: int = 0,
    table_id: str = "",
) -> str:
    """``names``: the leading name columns (pool, host ...): they wrap between words only; the
    TOTAL row reads TOTAL there, then blanks."""
    head = "".join(f"<th>{_esc(_SHORT.get(c, c.replace('_', ' ')))}</th>" for c in columns)

    def cells(r: dict[str, Any], is_total: bool) -> str:
        out = []
        for i, c in enumerate(columns):
            if i < names:
                text = ("TOTAL" if i == 0 else "") if is_total else "(none)" if r.get(c) is None else str(r[c])
                out.append(f'<td class="name">{_esc(text)}</td>')
            else:
                out.append(f"<td>{_esc(_cell(c, r.get(c)))}</td>")
        return "".join(out)

    body = [f"<tr>{cells(r, False)}</tr>" for r in rows]
    if total is not None:
        body.append(f'<tr class="total">{cells(total, True)}</tr>')
    ident = f' id="{table_id}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _stacked(report: CapacityReport) -> str:
    """One horizontal bar per group: its GPU-hours in each state, stacked, its fleet GPU-hours at
    its end (three significant digits: a small fleet's 0.42 GPU-h is not "0"); the legend below."""
    by = list(report.params.get("by", []))
    rows = sorted(report.groups, key=lambda r: -float(r["fleet_gpu_h"]))[:20]
    if not rows:
        return ""
    width, label_w, row_h = 760, 190, 22
    ends = [fmt_number(float(r["fleet_gpu_h"])) for r in rows]
    top = max(float(r["fleet_gpu_h"]) for r in rows) or 1.0
    scale = (width - label_w - CHAR_W * max(map(len, ends)) - 10) / top
    keys, keys_h = legend(
        [(label, colour, "") for _, label, colour in _STATE_BARS], label_w, 30 + row_h * len(rows) + 6, width
    )
    height = 30 + row_h * len(rows) + 6 + keys_h
    out = [
        f'<svg role="img" aria-label="GPU-hours by state" width="{width}" height="{height:.0f}" '
        f'viewBox="0 0 {width} {height:.0f}"><text x="0" y="14" class="title">GPU-hours by state</text>'
    ]
    for i, (r, end) in enumerate(zip(rows, ends, strict=True)):
        y, x = 26 + i * row_h, float(label_w)
        name = " / ".join("(none)" if r.get(k) is None else str(r[k]) for k in by)
        short = name if len(name) <= 30 else name[:29] + "…"
        out.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{_esc(short)}</text>')
        for column, label, colour in _STATE_BARS:
            w = float(r[column]) * scale
            if w <= 0:
                continue
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row_h - 6}" fill="{colour}">'
                       f"<title>{_esc(name)}: {label} {fmt_number(float(r[column]))} GPU-h</title></rect>")  # fmt: skip
            x += w
        out.append(f'<text x="{x + 4:.1f}" y="{y + 13}" class="value">{_esc(end)}</text>')
    out.append(keys)
    out.append("</svg>")
    return "".join(out)


def capacity_html(report: CapacityReport) -> str:
    """One offline page: the states chart, the groups, the shares, the notes, the JSON."""
    by = list(report.params.get("by", []))
    parts = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        csp_meta([_CSS]),  # only this style sheet; no script runs, nothing is fetched
        f"<title>{_esc(title(report))}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_esc(title(report))}</h1>",
        f'<p class="rule">{_esc(_rule_line(report))}</p>',
        '<p class="note">Every GPU-second of the fleet is in one state: unallocated (nobody held the GPU), '
        "allocated-idle (held, not busy), busy with its owner found, busy with no owner, or unobserved (no agent "
        "watched). Asset cost = GPU-hours x the rate card's rate, used or not. Money is exact; shown in cents.</p>",
        _stacked(report),
        f"<h2>By {_esc(', '.join(by))}: GPU-hours</h2>",
        '<div class="wide">',
        _html_table(by + _HOURS_VIEW, report.groups, report.total, len(by), "hours"),
        "</div>",
        f"<h2>By {_esc(', '.join(by))}: cost ({_esc(report.params.get('currency'))})</h2>",
        '<div class="wide">',
        _html_table(by + _MONEY_VIEW, report.groups, report.total, len(by), "money"),
        "</div>",
    ]
    if report.shares_total is not None:
        parts += [
            "<h2>Shared back to teams</h2>",
            '<div class="wide">',
            _html_table(_SHARE_VIEW, report.shares, report.shares_total, 1),
            "</div>",
        ]
    if report.warnings:
        parts += ["<h2>Notes</h2><ul>", *(f"<li>{_esc(w)}</li>" for w in report.warnings), "</ul>"]
    parts.append(json_block("capacity-data", report.as_dict()) + "</body></html>\n")
    return "".join(parts)


# -- the fleet --------------------------------------------------------------------------------------


def fleet_csv(rows: Sequence[dict[str, Any]]) -> str:
    return _csv([c.name for c in COLUMNS["fleet"]], rows)


def fleet_text(rows: Sequence[dict[str, Any]], table: Grid | None = None) -> str:
    _plain = table or _plain_table
    if not rows:
        return "no GPUs yet: run gpuledger agent on the GPU nodes, or record runs (docs/CAPACITY.md)\n"
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    head = f"Fleet: {len(rows)} GPUs (" + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ")"
    return head + "\n" + _plain(_grid(_FLEET_VIEW, rows)) + "\n"


def fleet_markdown(rows: Sequence[dict[str, Any]]) -> str:
    return f"# Fleet: {len(rows)} GPUs\n\n" + _md([c.name for c in COLUMNS["fleet"]], rows) + "\n"
