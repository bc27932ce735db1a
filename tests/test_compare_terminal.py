"""``gpuledger compare`` on a terminal: the same fitting rule as every table, with each
difference in its verdict's colour."""

from __future__ import annotations

import io

from rich.console import Console

from gpuledger.cli.report_render import compare_table

RUNS = [
    {"id": "0190e0e0-0000-7000-8000-0000000000aa", "label": "a", "name": "n" * 10_000},
    {"id": "0190e0e0-0000-7000-8000-0000000000bb", "label": "b", "name": "yolo-b"},
    {"id": "0190e0e0-0000-7000-8000-0000000000cc", "label": "c", "name": None},
]
WALL = [
    {"text": "1.00 s"},
    {"text": "1.25 s", "diff": "+25.0%", "verdict": "worse"},
    {"text": "0.500 s", "diff": "-50.0%", "verdict": "better"},
]
MODEL = {
    "runs": RUNS,
    "rows": [
        {"label": "wall time", "cells": WALL},
        {"label": "status", "cells": [{"text": "succeeded"}, {"text": "failed"}, {"text": "succeeded"}]},
    ],
    "notes": ["The runs differ in configuration (model, dataset, imgsz, batch or workers)."],
}


def _screen(width: int, colour: bool = False) -> str:
    out = Console(file=io.StringIO(), width=width, force_terminal=True, color_system="standard" if colour else None)
    compare_table(MODEL, out)
    return out.file.getvalue()  # type: ignore[attr-defined]


def test_compare_fits_and_names_the_runs_left_out() -> None:
    lines = _screen(50).splitlines()
    assert all(len(line) <= 50 for line in lines)
    wall = next(line for line in lines if line.startswith("wall time"))
    assert wall.rstrip().endswith("1.00 s")  # the first run (the baseline) stays
    assert "not shown at this width:" in "\n".join(lines) and "0000006c" in "\n".join(lines)


def test_compare_wide_shows_every_run_with_coloured_differences() -> None:
    plain = _screen(120)
    header = plain.splitlines()[1]
    assert header.split()[:2] == ["figure", "0000005a"] and "0000005v yolo-b" in header and "nnnnnnnn…" in header
    coloured = _screen(120, colour=True)
    assert "\x1b[31m(+25.0%)\x1b[0m" in coloured and "\x1b[32m(-50.0%)\x1b[0m" in coloured
