"""Terminal rendering of lists and tables (rich), kept apart from the commands."""

from __future__ import annotations

import re
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpuledger.core.units import NA, fmt_duration, fmt_hours

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
PIPE_WIDTH = 100_000  # a pipe or file gets whole lines: nothing is cut for a script to miss
TEXT_MAX = 20  # project, team and user are cut beyond this on a terminal
COMMAND_MIN = 12
GAP = 2  # between columns


def plain(text: object) -> str:
    """User text for the terminal: no rich markup and no control characters (escape sequences)."""
    return escape(_CONTROL.sub("?", str(text)))


def console() -> Console:
    """stdout as rich sees it: the terminal's width, or a pipe that cuts nothing."""
    return Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def runs_table(rows: list[dict]) -> None:
    """``gpuledger runs``: ids (short ids) and statuses are never cut; on a terminal too narrow for
    everything, the name / command column gives way first, then project, team and user."""
    out = console()
    fixed = ("ID", "STATUS", "STARTED (UTC)", "WALL", "GPUS", "BUSY GPU-H")
    cells = [
        [
            r.get("short_id") or r["id"],
            r["status"],
            (r["started_at"] or "")[:16].replace("T", " "),
            fmt_duration(r["wall_seconds"]),
            str(r["gpus"]),
            NA if r["busy_gpu_hours"] is None else fmt_hours(r["busy_gpu_hours"]),
        ]
        for r in rows
    ]
    texts = [[_CONTROL.sub("?", str(r[k] or "")) for k in ("project", "team", "user")] for r in rows]
    labels = [
        ("[replayed] " if r["replayed"] else "") + _CONTROL.sub("?", r["name"] or " ".join(r["command"])) for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(fixed)]
    text_widths = [max(len(h), *(len(t[i]) for t in texts)) for i, h in enumerate(("PROJECT", "TEAM", "USER"))]
    room = out.width - sum(widths) - GAP * (len(fixed) + 3)
    if room - sum(text_widths) < COMMAND_MIN:  # a narrow terminal: cut the free text first
        text_widths = [min(w, TEXT_MAX) for w in text_widths]
    command_width = max(COMMAND_MIN, room - sum(text_widths))
    table = Table(box=None, header_style="bold", pad_edge=False, padding=(0, GAP, 0, 0))
    for header, width in zip(fixed, widths, strict=True):
        table.add_column(header, no_wrap=True, min_width=width, max_width=width)
    for header, width in zip(("PROJECT", "TEAM", "USER"), text_widths, strict=True):
        table.add_column(header, no_wrap=True, max_width=width)
    table.add_column("NAME / COMMAND", no_wrap=True)
    for row, text, label in zip(cells, texts, labels, strict=True):
        table.add_row(
            *row,
            *(escape(_cut(t, w)) for t, w in zip(text, text_widths, strict=True)),
            escape(_cut(label, command_width)),
        )
    out.print(table)
