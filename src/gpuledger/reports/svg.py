"""Pieces of the reports' inline SVG charts (chargeback, capacity): text that fits, legends below
the plot that wrap instead of running out of the picture."""

from __future__ import annotations

import html
from collections.abc import Sequence

__all__ = ["CHAR_W", "legend", "short"]

CHAR_W = 6.6  # px per character of the charts' 11 px text, generous: legends and labels never overlap


def short(name: str, n: int) -> str:
    """``name`` cut to ``n`` characters, the cut marked."""
    return name if len(name) <= n else name[: n - 1] + "…"


def legend(entries: Sequence[tuple[str, str, str]], x0: float, y0: float, width: float) -> tuple[str, float]:
    """Legend entries (label, colour, extra rect attributes) in rows below a plot, wrapping at
    ``width``; returns the SVG and the height it takes. Labels are cut to 28 characters."""
    out, x, y = [], x0, y0
    for label, colour, extra in entries:
        text = short(label, 28)
        w = 14 + CHAR_W * len(text) + 16
        if x + w > width and x > x0:
            x, y = x0, y + 16
        out.append(
            f'<rect x="{x:.0f}" y="{y:.0f}" width="10" height="10" fill="{colour}"{extra}/>'
            f'<text x="{x + 14:.0f}" y="{y + 9:.0f}">{html.escape(text)}</text>'
        )
        x += w
    return "".join(out), y - y0 + 16
