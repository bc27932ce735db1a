"""The value-for-money sections of the chargeback HTML: the weekly trend (inline SVG), the TOP
lists and the anomalies with their likely causes, and their JSON twin
(``<script type="application/json" id="value-trends-data">``). No script runs, nothing is fetched.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

from gpuledger.core.chargeback.anomaly_causes import METRIC_NAMES
from gpuledger.core.chargeback.value_trends import week_label
from gpuledger.core.diagnosis.inference_rules import MIN_SLOWDOWN_PCT
from gpuledger.core.units import NA, fmt_count, fmt_money, fmt_number, fmt_pct
from gpuledger.reports.cost.value_trends import ValueTrends
from gpuledger.reports.safe_html import json_block

__all__ = ["value_sections"]

_HEADERS = {
    "rank": "#",
    "runs": "runs",
    "failed_runs": "failed",
    "cost": "cost",
    "idle_cost": "idle cost",
    "busy_share": "GPU busy",
    "epochs": "epochs",
    "map_points": "mAP points gained",
    "cost_per_epoch": "per epoch",
    "cost_per_1k_images": "per 1k images",
    "cost_per_map_point": "per mAP point",
}
_TOP_COLUMNS = [
    "rank",
    "runs",
    "failed_runs",
    "cost",
    "idle_cost",
    "busy_share",
    "map_points",
    "cost_per_map_point",
    "cost_per_epoch",
]
_TOPS = (
    ("top_by_cost", "Most expensive"),
    ("top_by_cost_per_map_point", "Worst cost per mAP point"),
    ("top_by_idle_cost", "Most idle cost"),
)
_CHART_GROUPS = 8
_WEEK = re.compile(r"\d{4}-W\d{2}")  # pivot columns hold a week's figure (money)


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _money(value: Any) -> str:
    """A cost per unit for people: cents from 1 up, three significant digits below (a cost per mAP
    point of 0.172, never a 0.00 that is not zero)."""
    if value is None:
        return NA
    d = Decimal(value)
    return fmt_money(d) if abs(d) >= 1 else fmt_number(float(d))


def _cell(column: str, value: Any) -> str:
    if value is None:
        return NA
    if column in ("cost", "idle_cost"):
        return fmt_money(value)
    if column.startswith("cost_per_") or _WEEK.fullmatch(column):  # pivots hold a cost per unit
        return _money(value)
    if column == "busy_share":
        return fmt_pct(float(value))
    if isinstance(value, float):
        return fmt_number(value)
    return str(value)


def _table(columns: Sequence[str], rows: Sequence[dict[str, Any]], css: str = "") -> str:
    head = "".join(f"<th>{_esc(_HEADERS.get(c, c.replace('_', ' ')))}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{_esc(_cell(c, row.get(c)))}</td>" for c in columns) + "</tr>" for row in rows
    )
    cls = f' class="{css}"' if css else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _pivot(vt: ValueTrends, metric: str) -> tuple[list[str], list[dict[str, Any]]]:
    """group x week -> the metric (money strings), weeks oldest first."""
    weeks = [week_label(w) for w in vt.weeks]
    rows: dict[str, dict[str, Any]] = {}
    for r in vt.series:
        rows.setdefault(r[vt.by], {vt.by: r[vt.by]})[r["week"]] = r[metric]
    return weeks, list(rows.values())


def _series(vt: ValueTrends, metric: str, groups: Sequence[str]) -> list[tuple[str, list[float | None]]]:
    weeks, rows = _pivot(vt, metric)
    by_group = {r[vt.by]: r for r in rows}
    return [
        (g, [None if by_group[g].get(w) is None else float(by_group[g][w]) for w in weeks])
        for g in groups
        if g in by_group
    ]


def _charts(vt: ValueTrends) -> str:
    from gpuledger.reports.cost.chargeback_html import _lines

    weeks = [week_label(w)[5:] for w in vt.weeks]  # "W10": eight full labels would overlap
    groups = [r[vt.by] for r in vt.tops.get("top_by_cost", [])][:_CHART_GROUPS]
    unit = vt.currency
    charts = [
        _lines(f"Cost per week by {vt.by} ({unit})", weeks, _series(vt, "cost", groups), unit),
        _lines(f"Cost per mAP point by {vt.by} ({unit})", weeks, _series(vt, "cost_per_map_point", groups), unit),
        _lines(f"Cost per epoch by {vt.by} ({unit})", weeks, _series(vt, "cost_per_epoch", groups), unit),
    ]
    return '<div class="charts">' + "".join(f'<div class="chart">{c}</div>' for c in charts if c) + "</div>"


def _anomalies(vt: ValueTrends) -> list[str]:
    rule = vt.rule
    how = (
        f"A {vt.by} is flagged when its cost per mAP point, per epoch or per 1,000 images in the last week "
        f"({week_label(vt.last_complete)}) is at least {rule.min_change * 100:.0f} % above the median of the "
        f"{rule.baseline_weeks} weeks before (weeks with at least {rule.min_runs} runs count, at least "
        f"{rule.min_baseline_weeks} needed; the last week needs {rule.min_runs} runs too). Causes compare the "
        "week's runs with those weeks': settings, GPU utilisation, failures, mAP and the diagnosis."
    )
    if vt.by == "model_version":
        how += (
            f" A model_version evaluated in any of these weeks is flagged too when its inference ms/image is over "
            f"{MIN_SLOWDOWN_PCT:g} % above its previous version's on a comparable evaluation (same split, GPU model "
            "and power limit, device, imgsz, batch, precision and software versions)."
        )
    parts = ['<h2 id="value-anomalies">Value anomalies</h2>', f'<p class="note">{_esc(how)}</p>']
    if not vt.anomalies and not vt.inference_anomalies:
        parts.append('<p class="none">No anomaly last week.</p>')
        return parts
    parts += _slower(vt)
    if not vt.anomalies:
        return parts
    parts.append('<ul class="anomalies">')
    parts += [f'<li class="anomaly warn">{_esc(a.message)}</li>' for a in vt.anomalies]
    parts.append("</ul>")
    rows = [
        {
            vt.by: a.group,
            "metric": METRIC_NAMES[a.metric],
            "week": week_label(a.week),
            "baseline": format(a.baseline, "f"),
            "current": format(a.current, "f"),
            "change": float(a.change),
            "causes": "; ".join(c.text for c in a.causes) or "—",
        }
        for a in vt.anomalies
    ]
    head = "".join(
        f"<th>{h}</th>"
        for h in (_esc(vt.by), "metric", "week", "median before", "last week", "change", "likely causes")
    )
    body = "".join(
        f"<tr><td>{_esc(r[vt.by])}</td><td>{_esc(r['metric'])}</td><td>{r['week']}</td>"
        f"<td>{_money(r['baseline'])}</td><td>{_money(r['current'])}</td><td>+{fmt_pct(r['change'])}</td>"
        f'<td class="text">{_esc(r["causes"])}</td></tr>'
        for r in rows
    )
    parts.append(f'<table class="anomaly-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')
    return parts


def _slower(vt: ValueTrends) -> list[str]:
    """Versions evaluated in the report's weeks whose inference is slower than their previous
    version's on a comparable evaluation (core/diagnosis/inference_rules.py)."""
    if not vt.inference_anomalies:
        return []
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            _esc(vt.by),
            "week",
            "previous version",
            "ms/image before",
            "ms/image after",
            "change",
            "likely cause",
        )
    )
    body = "".join(
        f"<tr><td>{_esc(a[vt.by])}</td><td>{_esc(a['week'])}</td><td>{_esc(a['previous_version'])}</td>"
        f"<td>{fmt_number(float(a['baseline']))}</td><td>{fmt_number(float(a['current']))}</td>"
        f"<td>+{fmt_pct(a['change'])}</td>"
        f'<td class="text">{_esc("; ".join(c["text"] for c in a["causes"]))}</td></tr>'
        for a in vt.inference_anomalies
    )
    return [
        '<ul class="anomalies">',
        *(f'<li class="anomaly warn">{_esc(a[vt.by])}: {_esc(a["message"])}</li>' for a in vt.inference_anomalies),
        "</ul>",
        f'<table class="anomaly-table inference-slower"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>',
    ]


def _images(n: int | None) -> str:
    return NA if n is None else f"{n:,}"


def _inference(vt: ValueTrends) -> list[str]:
    """Evaluation runs' cost per 1,000 images and energy per image by model_version and week."""
    if not vt.inference:
        return []
    head = "".join(
        f"<th>{h}</th>" for h in (_esc(vt.by), "week", "evaluations", "images", "cost", "per 1k images", "J/image")
    )
    body = "".join(
        f"<tr><td>{_esc(c['model_version'])}</td><td>{_esc(c['week'])}</td><td>{c['evaluations']}</td>"
        f"<td>{_esc(_images(c['images']))}</td><td>{_esc(fmt_money(c['cost']))}</td>"
        f"<td>{_esc(_money(c['cost_per_1k_images']))}</td><td>{_esc(fmt_number(c['j_per_image']))}</td></tr>"
        for c in vt.inference
    )
    return [
        f'<h3 id="value-inference">Inference by {_esc(vt.by)} and week ({_esc(vt.currency)})</h3>',
        '<p class="note">Evaluation runs (yolo val, predict, benchmark), each counted for its model_version '
        "label or the training that produced the weights it evaluated, in the ISO week it ended in: their "
        "whole cost per 1,000 images evaluated and the energy per image of their evaluated windows. A "
        "figure needs every evaluation of the cell to have it.</p>",
        '<div class="wide">',
        f'<table class="inference"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>',
        "</div>",
    ]


def value_sections(vt: ValueTrends) -> str:
    """The sections, in page order, then the JSON twin."""
    first, last = week_label(vt.weeks[0]), week_label(vt.weeks[-1])
    if vt.partial_to is not None:  # the report's period ends inside its last week
        last += f", counted to {datetime.fromtimestamp(vt.partial_to, tz=timezone.utc):%Y-%m-%d %H:%M} UTC"
    parts = [
        f'<h2 id="value-trend">Value for money by week and {_esc(vt.by)} ({first} to {last})</h2>',
        '<p class="note">Finished runs labelled with a model or model_version, each in the ISO week (UTC) it '
        "ended in, with its whole cost. Cost per mAP point = the week's cost / the mAP50-95 points its runs "
        "gained (a resumed training counts each point once); failed runs add their cost, not their points. "
        f"{fmt_count(vt.runs, 'run')}.</p>",
    ]
    if not vt.series:
        parts.append('<p class="none">No finished run with a model or model_version label in these weeks.</p>')
    else:
        parts.append(_charts(vt))
        weeks, pivot = _pivot(vt, "cost_per_map_point")
        parts += [
            f"<h3>Cost per mAP point ({_esc(vt.currency)})</h3>",
            '<div class="wide">',
            _table([vt.by, *weeks], pivot, "pivot"),
            "</div>",
            f'<h2 id="value-top">TOP {_esc(vt.by)}s ({first} to {last})</h2>',
        ]
        for key, title in _TOPS:
            rows = vt.tops.get(key) or []
            if rows:
                parts += [
                    f"<h3>{_esc(title)}</h3>",
                    _table(["rank", vt.by, *_TOP_COLUMNS[1:]], rows, key.replace("_", "-")),
                ]
    parts += _inference(vt)
    parts += _anomalies(vt)
    parts += [f'<p class="warn">{_esc(n)}</p>' for n in vt.notes]
    parts.append(json_block("value-trends-data", vt.as_dict()))
    return "".join(parts)
