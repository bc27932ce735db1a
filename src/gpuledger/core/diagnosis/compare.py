"""Runs side by side: the figures, their differences in % against the first run, and per-epoch
curves aligned on the epoch number. Pure: the caller loads each run's figures (reports/run/compare.py).

One implementation for every "compare" in gpuledger: resource figures always, money when a cost
engine priced the runs (``cost``, ``cost_per_map_point`` ... are then filled by the caller).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuledger.core.units import (
    change_pct,
    fmt_bytes,
    fmt_change,
    fmt_duration,
    fmt_hours,
    fmt_kwh,
    fmt_money,
    fmt_number,
    fmt_pct,
    fmt_seconds,
)


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    fmt: Callable[[Any], str]
    better: str | None = None  # "lower" / "higher": which way a difference is an improvement
    diff: bool = True  # False for text figures (no % difference)


def _num(significant: int = 3) -> Callable[[Any], str]:
    return lambda v: fmt_number(v, significant)


def _count(v: Any) -> str:
    return "n/a" if v is None else f"{v:,}"


def _money(v: Any) -> str:
    """A priced figure kept exact as "AMOUNT CURRENCY", shown in cents."""
    if v is None or v == "":
        return "n/a"
    amount, _, currency = str(v).partition(" ")
    return fmt_money(amount, currency or None)


def _text(v: Any) -> str:
    return "n/a" if v is None or v == "" else str(v)


FIGURES: tuple[Figure, ...] = (
    Figure("status", "status", _text, diff=False),
    Figure("gpus", "GPUs", _text, diff=False),
    # every field config_key compares, dataset too: the "differ in configuration" note must show why
    Figure("config", "model · dataset · imgsz · batch · workers", _text, diff=False),
    Figure("wall_seconds", "wall time", fmt_duration, "lower"),
    Figure("epochs", "epochs", _count),
    Figure("sec_per_epoch", "time per epoch (median)", fmt_duration, "lower"),
    Figure("images_per_s", "images / s (median epoch)", _num(), "higher"),
    Figure("best_map", "best mAP50-95", _num(4), "higher"),
    Figure("busy_gpu_hours", "busy GPU-hours", fmt_hours, "lower"),
    Figure("allocated_gpu_hours", "allocated GPU-hours", fmt_hours, "lower"),
    Figure("idle_gpu_hours", "idle GPU-hours", fmt_hours, "lower"),
    Figure("mean_utilization", "mean GPU utilisation", fmt_pct, "higher"),
    Figure("peak_memory_bytes", "peak VRAM", fmt_bytes),
    Figure("energy_kwh", "energy", fmt_kwh, "lower"),
    Figure("cpu_seconds", "CPU (process tree)", fmt_seconds),
    Figure("peak_rss_bytes", "peak RSS", fmt_bytes),
    Figure("busy_h_per_map_point", "busy GPU-h per mAP point", _num(), "lower"),
    Figure("cost", "cost", _money, "lower"),
    Figure("cost_per_map_point", "cost per mAP point", _money, "lower"),
    Figure("cost_per_epoch", "cost per epoch", _money, "lower"),
    Figure("findings", "findings (critical / warning / info)", _text, diff=False),
)


def _number(value: Any) -> float | None:
    """Numbers, and money kept as decimal strings, as floats for the % difference."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value).split()[0])
    except (ValueError, IndexError):
        return None


def diff_pct(value: Any, base: Any) -> float | None:
    """The change against ``base`` in percent; None against nothing or against zero."""
    return change_pct(_number(value), _number(base))


def rows(sides: Sequence[Mapping[str, Any]], figures: Sequence[Figure] = FIGURES) -> list[dict[str, Any]]:
    """One row per figure that any run has: cells with value, text and % difference to run 1.

    ``verdict`` says whether the difference is an improvement ("better"/"worse") where the figure
    has a direction; a difference under 0.5 % is "same"."""
    out = []
    for fig in figures:
        values = [side.get(fig.key) for side in sides]
        if all(v is None for v in values):
            continue
        cells = []
        for i, value in enumerate(values):
            pct = None if i == 0 or not fig.diff else diff_pct(value, values[0])
            cell: dict[str, Any] = {
                "value": value,
                "text": fig.fmt(value),
                "diff_pct": pct,
                "diff": None if pct is None else fmt_change(pct),
                "verdict": None,
            }
            if pct is not None and fig.better:
                cell["verdict"] = (
                    "same" if abs(pct) < 0.5 else ("better" if (pct < 0) == (fig.better == "lower") else "worse")
                )
            cells.append(cell)
        out.append({"key": fig.key, "label": fig.label, "better": fig.better, "cells": cells})
    return out


def aligned_curves(per_run: Sequence[Mapping[int, float | None]]) -> tuple[list[int], list[list[float | None]]]:
    """Per-epoch values of several runs on one epoch axis (the union of their epochs); an epoch a run
    does not have is None (a gap)."""
    epochs = sorted({e for curve in per_run for e in curve})
    return epochs, [[curve.get(e) for e in epochs] for curve in per_run]
