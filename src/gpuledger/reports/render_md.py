"""Markdown renderings, for pasting into a pull request or a ticket: tables, no charts.

User text goes through ``esc``: ``&``, ``<`` and ``>`` become entities (no raw HTML, no ``<url>``
autolink reaches a renderer that allows it), ``|`` and the Markdown marks (backticks, ``*``, ``_``,
``~``, ``[``, ``]``, backslash) are backslash-escaped (no broken table, code span, link or image),
and a line end is a space (a cell stays one row). The chargeback and capacity Markdown use it too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gpuledger.core.ids import short_id
from gpuledger.core.units import NA, fmt_bytes, fmt_duration, fmt_gpu_seconds, fmt_number

_SPECIAL = re.compile(r"([\\`*_~\[\]|])")
_ENTITIES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
_LINE_ENDS = re.compile(r"\r\n?|[\n\u2028\u2029]")
MAX_METRIC_COLUMNS = 4


def esc(value: Any) -> str:
    """User text as inert Markdown: safe in a table cell, a heading or a list item."""
    text = "" if value is None else str(value)
    return _SPECIAL.sub(r"\\\1", _LINE_ENDS.sub(" ", text).translate(_ENTITIES))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(esc(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return out


def _metric(value: Any) -> str:
    return NA if value is None else fmt_number(value, 4)  # fmt_number: NaN / infinity are n/a too


def render_run(model: dict[str, Any]) -> str:
    r = model["run"]
    title = f"gpuledger run `{esc(r['id'])}`" + (f" “{esc(r['name'])}”" if r.get("name") else "")
    lines = [f"### {title}", ""]
    if r.get("replayed"):
        lines += ["> **REPLAYED GPU TRACE — not real hardware**", ""]
    if r.get("series_expired"):
        lines += [f"> **{r['series_expired']['note']}**", ""]
    lines += table(["", ""], [(c["label"], f"{c['value']}  {c['detail']}".strip()) for c in model["cards"]])
    lines += ["", "#### Findings", ""]
    if not model["findings"]:
        lines.append("Nothing to report.")
    for f in model["findings"]:
        lines.append(f"{f['number']}. **{esc(f['severity'])}: {esc(f['title'])}** — {esc(f['detail'])}  ")
        lines.append(f"   *What to do:* {esc(f['action'])}")
    if model.get("cost_rows"):
        lines += ["", "#### Cost", ""]
        lines += table(["item", "value"], [(r["label"], r["value"]) for r in model["cost_rows"]])
    if model["gpus"]:
        lines += ["", "#### GPUs", ""]
        lines += table(
            ["#", "GPU", "busy", "busy h", "idle h", "energy", "peak VRAM", "peak VRAM (run)", "max temp", "throttled"],
            [
                (
                    g["index"],
                    g["name"],
                    g["busy"],
                    g["busy_h"],
                    g["idle_h"],
                    g["energy"],
                    g["peak_vram"],
                    g["peak_run_vram"],
                    g["max_temp"],
                    g["throttled"],
                )
                for g in model["gpus"]
            ],
        )
    epochs = [e for e in model["epochs"] if e["phase"] == "epoch"]
    if epochs:
        from gpuledger.reports.run.epochs import metric_columns

        keys = metric_columns(epochs, MAX_METRIC_COLUMNS)
        lines += ["", "#### Epochs", ""]
        lines += table(
            ["epoch", "wall", "GPU busy", "peak VRAM", *keys],
            [
                (
                    e["epoch"],
                    fmt_duration(e["wall_s"]),
                    fmt_gpu_seconds(e["gpu_busy_s"]),
                    fmt_bytes(e["gpu_mem_peak_b"]),
                    *(_metric(e["metrics"].get(k)) for k in keys),
                )
                for e in epochs
            ],
        )
    lines += [
        "",
        f"<sub>gpuledger {esc(model['gpuledger_version'])} · {esc(model['generated_at'])} · "
        f"`gpuledger report run {esc(short_id(r['id']))}` for the full report with charts</sub>",
        "",
    ]
    return "\n".join(lines)


def render_compare(model: dict[str, Any]) -> str:
    runs = model["runs"]
    heads = ["figure", *(str(r["label"]) for r in runs)]  # table() escapes each cell once
    rows = []
    for row in model["rows"]:
        cells = [row["label"]]
        for i, cell in enumerate(row["cells"]):
            diff = f" ({cell['diff']})" if i and cell.get("diff") else ""
            cells.append(f"{cell['text']}{diff}")
        rows.append(cells)
    lines = ["### gpuledger compare", ""]
    lines += table(heads, rows)
    lines += ["", "Differences in % are against the first run."]
    if model.get("notes"):
        lines += ["", *(f"- {esc(n)}" for n in model["notes"])]
    return "\n".join(lines) + "\n"
