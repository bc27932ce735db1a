"""The chargeback as one offline HTML file: tables and inline SVG charts, no script, no network.
A Content-Security-Policy allows only its own style sheet (reports/safe_html.py).

The report's JSON is embedded too (``<script type="application/json" id="chargeback-data">``), so
the page and its machine-readable twin travel together.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from gpuledger.core.chargeback.report import Chargeback
from gpuledger.reports.cost.render import (
    _RUN_VIEW,
    _SHORT,
    _USER_VIEW,
    _cell,
    _group_view,
    _title,
    _trend_pivot,
)
from gpuledger.reports.safe_html import csp_meta, json_block

if TYPE_CHECKING:
    from gpuledger.reports.cost.value_trends import ValueTrends

__all__ = ["chargeback_html"]

PALETTE = ("#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5", "#9c6b4e", "#9498a0")
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;
color:#1d1d1f;padding:0 16px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0;font-variant-numeric:tabular-nums}
th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th{background:#f6f6f8;font-weight:600}td:first-child,th:first-child{text-align:left}
tr.total td{font-weight:700;border-top:2px solid #999}
.charts{display:flex;flex-wrap:wrap;gap:24px}.chart{flex:1 1 520px}
.note{color:#666}.warn{color:#8a5a00}.wide{overflow-x:auto}
svg text{font:11px system-ui,sans-serif;fill:#333}svg text.title{font-weight:600}
"""


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _label(row: dict[str, Any], by: Sequence[str]) -> str:
    return " / ".join("(none)" if row.get(k) is None else str(row.get(k)) for k in by)


def _money(value: Any) -> float:
    return float(Decimal(value)) if value is not None else 0.0


def _table(columns: Sequence[str], rows: Sequence[dict[str, Any]], total: dict[str, Any] | None = None) -> str:
    head = "".join(f"<th>{_esc(_SHORT.get(c, c.replace('_', ' ')))}</th>" for c in columns)
    body = []
    for row in rows:
        body.append("<tr>" + "".join(f"<td>{_esc(_cell(c, row.get(c)))}</td>" for c in columns) + "</tr>")
    if total is not None:
        body.append(
            '<tr class="total">' + "".join(f"<td>{_esc(_cell(c, total.get(c)))}</td>" for c in columns) + "</tr>"
        )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _bars(
    title: str, items: list[tuple[str, float, float]], legend: tuple[str, str], unit: str, label_total: bool = True
) -> str:
    """Horizontal bars: a solid part and a lighter second part per item, labelled with their sum
    (or with the solid part alone when ``label_total`` is false: cost on the busy basis)."""
    if not items:
        return ""
    width, label_w, row_h = 560, 170, 22
    top = max((a + b for _, a, b in items), default=0.0) or 1.0
    scale = (width - label_w - 90) / top
    height = 30 + row_h * len(items) + 24
    out = [
        f'<svg role="img" aria-label="{_esc(title)}" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
    ]
    out.append(f'<text x="0" y="14" class="title">{_esc(title)}</text>')
    for i, (name, a, b) in enumerate(items):
        y = 26 + i * row_h
        wa, wb = a * scale, b * scale
        short = name if len(name) <= 26 else name[:25] + "…"
        out.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{_esc(short)}</text>')
        out.append(
            f'<rect x="{label_w}" y="{y}" width="{wa:.1f}" height="{row_h - 6}" fill="{PALETTE[0]}">'
            f"<title>{_esc(name)}: {a:,.2f} {unit}</title></rect>"
        )
        out.append(
            f'<rect x="{label_w + wa:.1f}" y="{y}" width="{wb:.1f}" height="{row_h - 6}" '
            f'fill="{PALETTE[0]}" fill-opacity="0.3">'
            f"<title>{_esc(name)}: {b:,.2f} {unit}</title></rect>"
        )
        out.append(f'<text x="{label_w + wa + wb + 4:.1f}" y="{y + 13}">{(a + b) if label_total else a:,.2f}</text>')
    ly = height - 10
    out.append(
        f'<rect x="{label_w}" y="{ly - 9}" width="10" height="10" fill="{PALETTE[0]}"/>'
        f'<text x="{label_w + 14}" y="{ly}">{_esc(legend[0])}</text>'
    )
    out.append(
        f'<rect x="{label_w + 170}" y="{ly - 9}" width="10" height="10" fill="{PALETTE[0]}" fill-opacity="0.3"/>'
        f'<text x="{label_w + 184}" y="{ly}">{_esc(legend[1])}</text>'
    )
    out.append("</svg>")
    return "".join(out)


def _axis(peak: float) -> str:
    """The top of an axis: whole numbers from 10 up, three significant digits below (0.171)."""
    return f"{peak:,.0f}" if peak >= 10 else f"{peak:.3g}"


def _lines(title: str, months: list[str], series: list[tuple[str, list[float | None]]], unit: str) -> str:
    if len(months) < 2 or not series:
        return ""
    width, height, left, right, top, bottom = 560, 260, 60, 150, 24, 30
    peak = max((v for _, vs in series for v in vs if v is not None), default=0.0) or 1.0
    px = (width - left - right) / (len(months) - 1)
    py = (height - top - bottom) / peak
    out = [
        f'<svg role="img" aria-label="{_esc(title)}" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
    ]
    out.append(f'<text x="0" y="14" class="title">{_esc(title)}</text>')
    base = height - bottom
    out.append(f'<line x1="{left}" y1="{base}" x2="{width - right}" y2="{base}" stroke="#999"/>')
    out.append(
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{_axis(peak)}</text>'
        f'<text x="{left - 4}" y="{base}" text-anchor="end">0</text>'
    )
    for i, m in enumerate(months):
        out.append(f'<text x="{left + i * px:.1f}" y="{base + 16}" text-anchor="middle">{_esc(m)}</text>')
    for n, (name, values) in enumerate(series):
        color = PALETTE[n % len(PALETTE)]
        pts = [(left + i * px, base - v * py, v) for i, v in enumerate(values) if v is not None]
        if len(pts) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y, v in pts:
            out.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}">'
                f"<title>{_esc(name)}: {v:,.2f} {unit}</title></circle>"
            )
        short = name if len(name) <= 20 else name[:19] + "…"
        out.append(f'<rect x="{width - right + 10}" y="{top + n * 16}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{width - right + 24}" y="{top + n * 16 + 9}">{_esc(short)}</text>')
    out.append("</svg>")
    return "".join(out)


def _charts(cb: Chargeback) -> str:
    by = list(cb.params.get("by", []))
    currency = str(cb.params.get("currency", ""))
    ranked = sorted(cb.groups, key=lambda r: -_money(r["cost"]))[:15]
    if cb.params.get("basis") == "allocated":
        money_items = [
            (_label(r, by), _money(r["cost"]) - _money(r["idle_cost"]), _money(r["idle_cost"])) for r in ranked
        ]
        legend = (f"busy cost ({currency})", f"idle cost ({currency}, billed)")
    else:
        money_items = [(_label(r, by), _money(r["cost"]), _money(r["idle_cost"])) for r in ranked]
        legend = (f"cost ({currency})", f"idle cost ({currency}, not billed)")
    hours = [(_label(r, by), r["busy_gpu_h"], max(0.0, r["idle_gpu_h"])) for r in ranked]
    columns, pivot = _trend_pivot(cb)
    months = columns[len(by) :]
    top_names = {_label(r, by) for r in ranked[:8]}
    series = [
        (_label(p, by), [_money(p[m]) if m in p else None for m in months]) for p in pivot if _label(p, by) in top_names
    ]
    charts = [
        _bars(f"Cost by {', '.join(by)}", money_items, legend, currency, cb.params.get("basis") == "allocated"),
        _bars("GPU-hours: busy and idle", hours, ("busy GPU-h", "idle GPU-h"), "GPU-h"),
        _lines(f"Cost per month ({currency})", months, series, currency),
    ]
    return '<div class="charts">' + "".join(f'<div class="chart">{c}</div>' for c in charts if c) + "</div>"


def chargeback_html(cb: Chargeback, top: int = 10, value: ValueTrends | None = None) -> str:
    """The page; ``value``: the weekly value-for-money sections (reports/cost/value_html.py), if given."""
    by = list(cb.params.get("by", []))
    parts = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        csp_meta([_CSS]),  # only this style sheet; no script runs, nothing is fetched
        f"<title>{_esc(_title(cb))}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_esc(_title(cb))}</h1>",
        '<p class="note">Allocated = GPU time held; busy = time the GPU was computing (driver samples); '
        "idle = allocated - busy. A100-eq h = busy hours x the GPU model's normalisation factor. "
        "Money is exact; shown rounded to cents.</p>",
        _charts(cb),
        f"<h2>By {_esc(', '.join(by))}</h2>",
        '<div class="wide">',
        _table(_group_view(cb), cb.groups, cb.total),  # with --include-replayed: replayed_runs
        "</div>",
    ]
    for title, rows, view in (
        ("Top runs by cost", cb.top_runs_by_cost, _RUN_VIEW),
        ("Top runs by idle cost", cb.top_runs_by_idle_cost, _RUN_VIEW),
        ("Top users by cost", cb.top_users_by_cost, _USER_VIEW),
        ("Top users by idle cost", cb.top_users_by_idle_cost, _USER_VIEW),
    ):
        if rows:
            parts += [f"<h2>{_esc(title)}</h2>", _table(view, rows[:top])]
    columns, pivot = _trend_pivot(cb)
    parts += [f"<h2>Cost by month ({_esc(cb.params.get('currency'))})</h2>", _table(columns, pivot)]
    if cb.anomalies:
        parts += ["<h2>Anomalies</h2>", _table([*by, "metric", "baseline", "current", "change"], cb.anomalies)]
    if value is not None:
        from gpuledger.reports.cost.value_html import value_sections

        parts.append(value_sections(value))
    if cb.warnings:
        parts += ["<h2>Notes</h2><ul>"] + [f'<li class="warn">{_esc(w)}</li>' for w in cb.warnings] + ["</ul>"]
    parts.append(json_block("chargeback-data", cb.as_dict()))
    parts.append("</body></html>\n")
    return "".join(parts)
