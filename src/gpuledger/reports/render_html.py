"""HTML rendering: one self-contained file (uPlot, styles and data inlined) that opens offline.

Templates are Jinja2 package data with autoescape on, so every piece of user text (run names,
labels, commands, metric keys, event messages) is escaped. The chart data travels as JSON in a
``<script type="application/json">`` block with ``<``, ``>``, ``&``, U+2028 and U+2029 escaped as
``\\u003c``... (reports/safe_html.py), so no string in it can close the script element.

Every page carries a Content-Security-Policy (a ``<meta>`` at the top of its head): scripts and
style sheets run only when they are the bundled ones, named by their sha256, nothing may be
fetched from anywhere, and a link cannot submit a form. So a report opened from a share or a mail
attachment cannot be made to run anything else, even by a run name that got past the escaping.
"""

from __future__ import annotations

import json
import math
import shlex
from datetime import datetime, timezone
from functools import cache
from importlib import resources
from typing import Any

import jinja2

from gpuledger import __version__
from gpuledger.core.units import NA, fmt_bytes, fmt_duration, fmt_gpu_seconds, fmt_number, fmt_seconds
from gpuledger.reports.safe_html import policy, script_safe

MAX_METRIC_COLUMNS = 4


def _read(folder: str, name: str) -> str:
    return resources.files("gpuledger.reports").joinpath(folder, name).read_text(encoding="utf-8")


@cache
def assets() -> dict[str, str]:
    return {
        "uplot_js": _read("assets", "uPlot.iife.min.js"),
        "uplot_css": _read("assets", "uPlot.min.css"),
        "report_css": _read("templates", "report.css"),
        "charts_js": _read("templates", "charts.js"),
    }


@cache
def content_security_policy() -> str:
    """The report's policy: only the inlined uPlot and chart script and the two style sheets."""
    a = assets()
    return policy([a["uplot_css"], a["report_css"]], [a["uplot_js"], a["charts_js"]])


def _clock(t: float | None) -> str:
    """A time of day in UTC (the template says so: the charts draw the browser's time zone)."""
    if t is None:
        return "?"
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%H:%M:%S")


def _num(value: Any, significant: int = 3) -> str:
    """A figure (core/units.py policy: three significant digits; metrics ask for four; absent n/a)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return NA
    return fmt_number(value, significant)


def _command(argv: Any) -> str:
    """The command as a shell would take it back (quoted where needed), as ``gpuledger show`` prints it."""
    return shlex.join(str(a) for a in argv or [])


def _metric_keys(rows: list[dict[str, Any]]) -> list[str]:
    from gpuledger.reports.run.epochs import metric_columns

    return metric_columns(rows, MAX_METRIC_COLUMNS)


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("gpuledger.reports", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        clock=_clock,
        num=_num,
        duration=fmt_duration,
        seconds=fmt_seconds,
        gpu_seconds=fmt_gpu_seconds,
        bytes=fmt_bytes,
        command=_command,
        metric_keys=_metric_keys,
    )
    return env


def script_json(obj: Any) -> str:
    """JSON safe inside a <script> element (and strict: NaN / inf become null)."""
    try:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str)
    except ValueError:  # a NaN somewhere: the slower pass that turns it into null
        text = json.dumps(_finite(obj), separators=(",", ":"), allow_nan=False, default=str)
    return script_safe(text)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _page(template: str, model: dict[str, Any], page_data: dict[str, Any], **context: Any) -> str:
    return (
        environment()
        .get_template(template)
        .render(
            m=model,
            assets=assets(),
            csp=content_security_policy(),
            version=__version__,
            generated_at=model.get("generated_at"),
            data_json=script_json(page_data),
            **context,
        )
    )


def render_run(model: dict[str, Any]) -> str:
    run = model["run"]
    start = run.get("started_at_epoch")
    end = (start or 0) + (run.get("wall_seconds") or 0) if start is not None else None
    page_data = {
        "charts": model["charts"],
        "marks": model["marks"],
        "findings": [
            {"number": f["number"], "severity": f["severity"], "evidence": f["evidence"]} for f in model["findings"]
        ],
        "xmin": start,
        "xmax": end,
    }
    return _page("run.html.j2", model, page_data, r=run)


def render_compare(model: dict[str, Any]) -> str:
    page_data = {"charts": model["charts"], "marks": [], "findings": []}
    return _page("compare.html.j2", model, page_data)
