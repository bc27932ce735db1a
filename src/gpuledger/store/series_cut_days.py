"""A series-only run's day cut exactly at a price change inside it (docs/SCALE.md section 4).

A series-only run (store/series_segments.py) has per run x GPU x UTC-day sums in the ledger
(``series_day_sums``), not its rows. A day sum cannot be split at a price change (a rate card's
``from`` / ``to`` instant) inside its day, so for exactly those (run, GPU, day)s the run's
intervals of the day are read from the series store by key (``gpu_intervals_between``: the day's
partitions) and handed to the cost read as raw rows, which split them at the change as
``cost_queries.raw_intervals`` rows are split. Each row is clipped to the day: a row crossing a
midnight keeps only its part in the day (in proportion to time, as the day sums split it), since
the other day's sum holds the rest.

The rows read must make up the day sum they replace (the same rows ending in the day, the same
counts of measured rows); when they do not (the store dropped the day past its window, or part
of it) or no store was given, the day is priced whole, at the price in force at its middle, as
before, and a note says so (``notes``): never silently.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuledger.core.ids import short_id
from gpuledger.core.pricing.usage import DAY_S
from gpuledger.store import series_day_sums

if TYPE_CHECKING:
    from gpuledger.store.ledger import Ledger
    from gpuledger.store.series_read import TieredReads

_COUNTS = ("intervals", "busy_n", "energy_n")


@dataclass
class CutDays:
    """The series store a cost read takes a series-only run's price-change days from (None: none
    given), and what it could not split. ``unsplit``: (run, day) priced whole."""

    reads: TieredReads | None
    unsplit: dict[tuple[str, int], str] = field(default_factory=dict)  # (run, day) -> why

    @classmethod
    def of(cls, ledger: Ledger) -> CutDays:
        return cls(getattr(ledger, "series_reads", None))

    def split(
        self, held: Sequence[dict[str, Any]], cut_days: Collection[int]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(the day sums ``held`` to keep, the raw rows that replace the others): each (run, day)
        of ``cut_days`` whose store rows make up its day sums is read raw, the rest kept whole."""
        wanted: dict[tuple[str, int], list[dict[str, Any]]] = {}
        keep: list[dict[str, Any]] = []
        for s in held:
            if s["day"] in cut_days:
                wanted.setdefault((s["run_id"], int(s["day"])), []).append(s)
            else:
                keep.append(s)
        raw: list[dict[str, Any]] = []
        for (run_id, day), sums in sorted(wanted.items()):
            rows, why = self._day_rows(run_id, day, sums)
            if rows is None:
                self.unsplit[(run_id, day)] = why
                keep += sums
            else:
                raw += rows
        return keep, raw

    def _day_rows(
        self, run_id: str, day: int, sums: Sequence[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]] | None, str]:
        if self.reads is None or not self.reads.windowed:
            return None, "no series store was given (--series or GPULEDGER_SERIES)"
        rows = self.reads.store.gpu_intervals_between(run_id, day * DAY_S, (day + 1) * DAY_S)
        found = day_parts(run_id, day, sums, rows)
        if found is None:
            return None, "the series store no longer holds all of its intervals (dropped past its window)"
        return found, ""

    def notes(self) -> list[str]:
        """One line per (run, day) priced whole."""
        out = []
        for (run_id, day), why in sorted(self.unsplit.items()):
            date = time.strftime("%Y-%m-%d", time.gmtime(day * DAY_S))
            out.append(
                f"run {short_id(run_id)} on {date}: a price changes within the day, but {why}; the day is "
                "priced whole at the price in force at its middle"
            )
        return out


def day_parts(
    run_id: str, day: int, sums: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]
) -> list[dict[str, Any]] | None:
    """The store ``rows`` touching ``day`` clipped to it (``_clipped``) for the GPUs of the day
    sums ``sums``; None when they do not make up those sums (a row the store no longer holds, its
    day dropped past the store's window or the day before it for a row crossing midnight, would
    go unpriced)."""
    gpus = {s["device_uuid"] for s in sums}
    rows = [r for r in rows if r["device_uuid"] in gpus]
    columns = ("device_uuid", "t0", "t1", *series_day_sums.SUMMED)
    redone = series_day_sums.day_rows(run_id, [[r[c] for c in columns] for r in rows], columns)
    found = {s["device_uuid"]: s for s in redone if s["day"] == day}
    for s in sums:
        got = found.get(s["device_uuid"])
        if got is None or any(int(got[c]) != int(s[c]) for c in _COUNTS):
            return None
    return [_clipped(run_id, r, day * DAY_S, (day + 1) * DAY_S) for r in rows]


def _clipped(run_id: str, r: dict[str, Any], lo: float, hi: float) -> dict[str, Any]:
    """The part of the store row ``r`` inside [lo, hi), its sums in proportion to time; ``ends``:
    whether the row ends in the day (the day it is counted on, as the day sums count it)."""
    t0, t1 = float(r["t0"]), float(r["t1"])
    a, b = max(t0, lo), min(t1, hi)
    share = (b - a) / (t1 - t0) if t1 > t0 else 1.0
    busy, energy = r.get("busy_s"), r.get("energy_j")
    return {
        "run_id": run_id, "device_uuid": r["device_uuid"], "t0": a, "t1": b, "ends": t1 <= hi,
        "busy_s": None if busy is None else float(busy) * share,
        "energy_j": None if energy is None else float(energy) * share,
    }  # fmt: skip
