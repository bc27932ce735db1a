"""The chargeback as one offline HTML file: tables and inline SVG charts, no script, no network.
A Content-Security-Policy allows only its own style sheet (reports/safe_html.py).

The report's JSON is embedded too (``<script type="application/json" id="chargeback-data">``), so
the page and its machine-readable twin travel together.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from gpuledger.core.chargeback.report import Chargeback
from gpuledger.core.units import fmt_money, fmt_number, fmt_pct
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
from gpuledger.reports.svg import CHAR_W, legend
from gpuledger.reports.svg import short as _short

if TYPE_CHECKING:
    from gpuledger.reports.cost.value_trends import ValueTrends

__all__ = ["chargeback_html"]

PALETTE = ("#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5", "#9c6b4e", "#9498a0")
# Tables fit a laptop's width (a scroll bar hides columns nobody scrolls to): headers wrap, figures do
# not, names break between words only, long text (anomaly causes) wraps.
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;
color:#1d1d1f;padding:0 16px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0;font-variant-numeric:tabular-nums;font-size:13px}
th,td{padding:3px 6px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th{background:#f6f6f8;font-weight:600;white-space:normal;vertical-align:bottom}
td:first-child,th:first-child{text-align:left}td.name,th.name{text-align:left;white-space:normal;word-break:keep-all}
td.text{text-align:left;white-space:normal;min-width:16em}
tr.total td{font-weight:700;border-top:2px solid #999}
.charts{display:flex;flex-wrap:wrap;gap:24px}.chart{flex:1 1 520px;min-width:0}.chart svg{max-width:100%;height:auto}
.note{color:#666}.warn{color:#8a5a00}.wide{overflow-x:auto}
svg text{font:11px system-ui,sans-serif;fill:#333}svg text.title{font-weight:600}
"""


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _label(row: dict[str, Any], by: Sequence[str]) -> str:
    return " / ".join("(none)" if row.get(k) is None else str(row.get(k)) for k in by)


def _money(value: Any) -> float:
    return float(Decimal(value)) if value is not None else 0.0


def _table(
    columns: Sequence[str],
    rows: Sequence[dict[str, Any]],
    total: dict[str, Any] | None = None,
    names: int = 0,
    table_id: str = "",
) -> str:
    """``names``: how many leading columns are names (team, project ...): they wrap between words."""
    cls = ["name" if i < names else "" for i in range(len(columns))]
    head = "".join(
        f'<th class="{c}">{_esc(_SHORT.get(col, col.replace("_", " ")))}</th>'
        if c
        else f"<th>{_esc(_SHORT.get(col, col.replace('_', ' ')))}</th>"
        for col, c in zip(columns, cls, strict=True)
    )

    def cells(row: dict[str, Any], is_total: bool) -> str:
        out = []
        for i, col in enumerate(columns):
            value = row.get(col)
            # the TOTAL row names no group: "TOTAL", then blanks (never "n/a")
            if i < names:  # a group without this key is "(none)", as in the charts
                text = ("TOTAL" if i == 0 else "") if is_total else "(none)" if value is None else str(value)
            else:
                text = _cell(col, value)
            out.append(f'<td class="{cls[i]}">{_esc(text)}</td>' if cls[i] else f"<td>{_esc(text)}</td>")
        return "".join(out)

    body = [f"<tr>{cells(row, False)}</tr>" for row in rows]
    if total is not None:
        body.append(f'<tr class="total">{cells(total, True)}</tr>')
    ident = f' id="{table_id}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _bars(
    title: str,
    items: list[tuple[str, float, float]],
    legend_labels: tuple[str, str],
    fmt: Callable[[float], str],
    label_total: bool = True,
) -> str:
    """Horizontal bars: a solid part and a lighter second part per item, labelled with their sum
    (or with the solid part alone when ``label_total`` is false: cost on the busy basis), in the
    report's number policy (``fmt``: cents for money, three digits for hours)."""
    if not items:
        return ""
    width, label_w, row_h = 560, 170, 22
    labels = [fmt(a + b if label_total else a) for _, a, b in items]
    room = CHAR_W * max(len(t) for t in labels) + 8
    top = max((a + b for _, a, b in items), default=0.0) or 1.0
    scale = (width - label_w - room) / top
    keys, keys_h = legend(
        [(legend_labels[0], PALETTE[0], ""), (legend_labels[1], PALETTE[0], ' fill-opacity="0.3"')],
        label_w, 30 + row_h * len(items) + 6, width,
    )  # fmt: skip
    height = 30 + row_h * len(items) + 6 + keys_h
    out = [
        f'<svg role="img" aria-label="{_esc(title)}" width="{width}" height="{height:.0f}" '
        f'viewBox="0 0 {width} {height:.0f}">'
    ]
    out.append(f'<text x="0" y="14" class="title">{_esc(title)}</text>')
    for i, ((name, a, b), shown) in enumerate(zip(items, labels, strict=True)):
        y = 26 + i * row_h
        wa, wb = a * scale, b * scale
        out.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{_esc(_short(name, 26))}</text>')
        out.append(
            f'<rect x="{label_w}" y="{y}" width="{wa:.1f}" height="{row_h - 6}" fill="{PALETTE[0]}">'
            f"<title>{_esc(name)}: {_esc(fmt(a))}</title></rect>"
        )
        out.append(
            f'<rect x="{label_w + wa:.1f}" y="{y}" width="{wb:.1f}" height="{row_h - 6}" '
            f'fill="{PALETTE[0]}" fill-opacity="0.3">'
            f"<title>{_esc(name)}: {_esc(fmt(b))}</title></rect>"
        )
        out.append(f'<text x="{label_w + wa + wb + 4:.1f}" y="{y + 13}" class="value">{_esc(shown)}</text>')
    out.append(keys)
    out.append("</svg>")
    return "".join(out)


def _axis(peak: float) -> str:
    """The top of an axis in the report's number policy (three significant digits)."""
    return fmt_number(peak)


def _lines(title: str, months: list[str], series: list[tuple[str, list[float | None]]], unit: str) -> str:
    """Lines over categories (weeks), evenly spaced across the plot; the legend below it."""
    if len(months) < 2 or not series:
        return ""
    width, left, right, top, plot_h = 560, 60, 20, 24, 200
    peak = max((v for _, vs in series for v in vs if v is not None), default=0.0) or 1.0
    px = (width - left - right) / (len(months) - 1)
    py = plot_h / peak
    base = top + plot_h
    keys, keys_h = legend(
        [(name, PALETTE[n % len(PALETTE)], "") for n, (name, _) in enumerate(series)], left, base + 26, width
    )
    height = base + 26 + keys_h
    out = [
        f'<svg role="img" aria-label="{_esc(title)}" width="{width}" height="{height:.0f}" '
        f'viewBox="0 0 {width} {height:.0f}">'
    ]
    out.append(f'<text x="0" y="14" class="title">{_esc(title)}</text>')
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
                f"<title>{_esc(name)}: {fmt_number(v)} {_esc(unit)}</title></circle>"
            )
    out.append(keys)
    out.append("</svg>")
    return "".join(out)


def _month_bars(title: str, months: list[str], series: list[tuple[str, list[float | None]]], currency: str) -> str:
    """Cost per month: one stacked bar per month (a band per group), its total on top, months
    spread across the plot, the legend below it."""
    if not months or not series:
        return ""
    width, left, right, top, plot_h = 560, 60, 20, 30, 190
    totals = [sum(vs[i] or 0.0 for _, vs in series) for i in range(len(months))]
    peak = max(totals) or 1.0
    slot = (width - left - right) / len(months)
    bar_w, py, base = min(70.0, slot * 0.6), plot_h / peak, top + plot_h
    keys, keys_h = legend(
        [(name, PALETTE[n % len(PALETTE)], "") for n, (name, _) in enumerate(series)], left, base + 26, width
    )
    height = base + 26 + keys_h
    out = [
        f'<svg role="img" aria-label="{_esc(title)}" width="{width}" height="{height:.0f}" '
        f'viewBox="0 0 {width} {height:.0f}">',
        f'<text x="0" y="14" class="title">{_esc(title)}</text>',
        f'<line x1="{left}" y1="{base}" x2="{width - right}" y2="{base}" stroke="#999"/>',
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{_axis(peak)}</text>',
        f'<text x="{left - 4}" y="{base}" text-anchor="end">0</text>',
    ]
    for i, month in enumerate(months):
        cx = left + slot * (i + 0.5)
        y = float(base)
        for n, (name, values) in enumerate(series):
            v = values[i] or 0.0
            if v <= 0:
                continue
            h = v * py
            y -= h
            out.append(
                f'<rect x="{cx - bar_w / 2:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                f'fill="{PALETTE[n % len(PALETTE)]}"><title>{_esc(name)} {_esc(month)}: '
                f"{_esc(fmt_money(v, currency))}</title></rect>"
            )
        out.append(
            f'<text x="{cx:.1f}" y="{y - 4:.1f}" text-anchor="middle" class="value">{_esc(fmt_money(totals[i]))}</text>'
        )
        out.append(f'<text x="{cx:.1f}" y="{base + 16}" text-anchor="middle">{_esc(month)}</text>')
    out.append(keys)
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
        keys = (f"busy cost ({currency})", f"idle cost ({currency}, billed)")
    else:
        money_items = [(_label(r, by), _money(r["cost"]), _money(r["idle_cost"])) for r in ranked]
        keys = (f"cost ({currency})", f"idle cost ({currency}, not billed)")
    hours = [(_label(r, by), r["busy_gpu_h"], max(0.0, r["idle_gpu_h"])) for r in ranked]
    columns, pivot = _trend_pivot(cb)
    months = columns[len(by) :]
    groups = [p for p in pivot if p.get(by[0]) != "TOTAL"] if by else pivot
    groups.sort(key=lambda p: -sum(_money(p.get(m)) for m in months))
    series = [(_label(p, by), [_money(p[m]) if p.get(m) is not None else None for m in months]) for p in groups[:8]]
    if len(groups) > 8:
        rest = [sum(_money(p.get(m)) for p in groups[8:]) for m in months]
        series.append((f"{len(groups) - 8} others", list(rest)))
    charts = [
        _bars(f"Cost by {', '.join(by)} ({currency})", money_items, keys, fmt_money,
              cb.params.get("basis") == "allocated"),
        _bars("GPU-hours: busy and idle", hours, ("busy GPU-h", "idle GPU-h"), fmt_number),
        _month_bars(f"Cost per month ({currency})", months, series, currency),
    ]  # fmt: skip
    return '<div class="charts">' + "".join(f'<div class="chart">{c}</div>' for c in charts if c) + "</div>"


def _anomaly(row: dict[str, Any]) -> dict[str, Any]:
    """An anomaly's figures for people: an idle share in percent, a cost per A100-hour in cents."""
    show = fmt_pct if row.get("metric") == "idle_share" else fmt_money
    return {**row, **{k: show(row[k]) for k in ("baseline", "current") if row.get(k) is not None}}


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
        _table(
            _group_view(cb), cb.groups, cb.total, names=len(by), table_id="groups"
        ),  # with --include-replayed: replayed_runs
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
    total = next((p for p in pivot if by and p.get(by[0]) == "TOTAL"), None)
    rows = [p for p in pivot if p is not total]
    parts += [
        f"<h2>Cost by month ({_esc(cb.params.get('currency'))})</h2>",
        _table(columns, rows, total, len(by), table_id="trend"),
    ]
    if cb.anomalies:
        parts += [
            "<h2>Anomalies</h2>",
            _table([*by, "metric", "baseline", "current", "change"], [*map(_anomaly, cb.anomalies)], None, len(by)),
        ]
    if value is not None:
        from gpuledger.reports.cost.value_html import value_sections

        parts.append(value_sections(value))
    if cb.warnings:
        parts += ["<h2>Notes</h2><ul>"] + [f'<li class="warn">{_esc(w)}</li>' for w in cb.warnings] + ["</ul>"]
    parts.append(json_block("chargeback-data", cb.as_dict()))
    parts.append("</body></html>\n")
    return "".join(parts)
