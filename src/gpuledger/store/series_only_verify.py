"""``audit verify --series``: a sealed series-only run (store/series_segments.py) against the store.

Its seal (``run.series_sealed``, recorded from what the store held at the run's final push) has
per GPU and for the host the rows, seq range, sums and sha256 of the whole run, and per UTC day a
row starts on (the day partition the store keeps it in) the same of that day's rows (``days``).
While the store keeps every day of the run, the whole is compared, as before. Once the store has
dropped some of its days past its own window (``series.days_dropped``, store/series_window.py),
those days are expired, not read; each day it still keeps is compared with the seal's summary of
that day (a day gone without a recorded drop is missing, a changed row changes its sha256), and
the ledger's day sums of those days (what cost and the run lists read) with the store's rows.
A seal recorded before the per-day summaries has only the day sums to check the days kept against.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from gpuledger.core.pricing.usage import DAY_S
from gpuledger.series.base import SeriesStore
from gpuledger.store import series_day_sums, series_tier

HOST = "host"  # the host stream's key in ``days``


def day_of(row: Mapping[str, Any]) -> str:
    """The UTC day (YYYY-MM-DD) of the store's partition holding ``row``: the day its t0 lies in."""
    return series_day_sums.iso_day(math.floor(float(row["t0"]) / DAY_S))


def by_day(gpu: Sequence[Mapping[str, Any]], host: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The seal's ``days``: per stream (GPU uuid, ``HOST``) per day, the summary of its rows (in
    seq order, as the store returns them sorted) as tiering records a day."""
    streams: dict[str, dict[str, list[Mapping[str, Any]]]] = {}
    for r in gpu:
        streams.setdefault(str(r["device_uuid"]), {}).setdefault(day_of(r), []).append(r)
    for r in host:
        streams.setdefault(HOST, {}).setdefault(day_of(r), []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for stream, days in sorted(streams.items()):
        sums, columns = (series_tier.HOST_SUMS, series_tier.HOST_COLUMNS) if stream == HOST else (
            series_tier.GPU_SUMS, series_tier.GPU_COLUMNS)  # fmt: skip
        out[stream] = {
            day: series_tier.summary(sorted(rows, key=lambda r: int(r["seq"])), sums, columns)
            for day, rows in sorted(days.items())
        }
    return out


@dataclass
class RunCheck:
    problems: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)  # days (YYYY-MM-DD) not read: past the store's window
    notes: list[str] = field(default_factory=list)


def check(
    store: SeriesStore, run_id: str, seal: Mapping[str, Any], kept_from: str, sums: Sequence[Mapping[str, Any]]
) -> RunCheck:
    """Compare what ``store`` holds of the run with its ``seal`` and its day sums ``sums``
    (``series_day_sums`` rows); ``kept_from``: the first day the store keeps ("" for all)."""
    out = RunCheck()
    gpu = sorted(store.gpu_intervals(run_id), key=lambda r: (str(r["device_uuid"]), int(r["seq"])))
    host = sorted(store.host_intervals(run_id), key=lambda r: int(r["seq"]))
    sealed = seal.get("days")
    days = {d for stream in (sealed or {}).values() for d in stream}
    days |= {series_day_sums.iso_day(int(s["day"])) for s in sums}
    out.expired = sorted(d for d in days if d < kept_from)
    if not out.expired:  # the store keeps every day of the run: the whole is compared
        found = series_tier.day_summary(gpu, host)
        out.problems = [f"{line} (sealed series-only run)" for line in series_tier.differences(run_id, seal, found)]
        return out
    gpu = [r for r in gpu if day_of(r) >= kept_from]
    host = [r for r in host if day_of(r) >= kept_from]
    if sealed is None:
        out.notes.append(
            f"series-only run {run_id}: sealed before the seal kept per-day summaries; the days the store "
            "still keeps were checked against the ledger's day sums only"
        )
    else:
        out.problems += _day_differences(run_id, sealed, by_day(gpu, host), kept_from)
    out.problems += _sum_differences(run_id, sums, gpu, kept_from)
    return out


def _day_differences(
    run_id: str, sealed: Mapping[str, Mapping[str, Any]], found: Mapping[str, Mapping[str, Any]], kept_from: str
) -> list[str]:
    """One line per stream and kept day whose rows differ from the seal's summary of them."""
    out = []
    for stream, days in sorted(sealed.items()):
        what = "host" if stream == HOST else f"GPU {stream}"
        for day, want in sorted(days.items()):
            if day < kept_from:
                continue
            got = found.get(stream, {}).get(day)
            if got == want:
                continue
            lo, hi = want["seq"]
            why = series_tier.why_differs(want, got, "sealed")
            out.append(f"run {run_id} {what} seq {lo}-{hi} ({day}): {why} (sealed series-only run)")
    return out


def _sum_differences(
    run_id: str, sums: Sequence[Mapping[str, Any]], gpu: Sequence[Mapping[str, Any]], kept_from: str
) -> list[str]:
    """One line per GPU and kept day whose ledger day sums the store's rows do not make up. On the
    first kept day, where the day sum starts at midnight, a row crossing into it from a dropped day
    may have gone with its day (its part is in the day sum): one row fewer is not a difference,
    and the sums are compared only when no row is missing."""
    columns = ("device_uuid", "t0", "t1", *series_day_sums.SUMMED)
    redone = series_day_sums.day_rows(run_id, [[r.get(c) for c in columns] for r in gpu], columns)
    found = {(s["device_uuid"], int(s["day"])): s for s in redone}
    first = _day_number(kept_from)
    out = []
    for want in sorted(sums, key=lambda s: (str(s["device_uuid"]), int(s["day"]))):
        day = int(want["day"])
        if day < first:
            continue
        got = found.get((str(want["device_uuid"]), day))
        crossed = day == first and float(want["t0"]) <= day * DAY_S  # a row from the day before, maybe gone
        why = _first_day_mismatch(want, got) if crossed else _sum_mismatch(want, got)
        if why:
            out.append(
                f"run {run_id} GPU {want['device_uuid']} ({series_day_sums.iso_day(day)}): the ledger's day sums "
                f"differ from the store's rows: {why} (sealed series-only run)"
            )
    return out


def _sum_mismatch(want: Mapping[str, Any], got: Mapping[str, Any] | None) -> str:
    if got is None:
        return "the store holds no row of the day"
    for count in ("intervals", "busy_n", "energy_n"):
        if int(got[count]) != int(want[count]):
            return f"{count} {want[count]} in the ledger, {got[count]} in the store"
    # The store keeps ms and mJ: each row may differ by half a unit from what the ledger summed.
    slack = 0.0005 * (int(want["intervals"]) + 2) + 1e-6
    for column in series_day_sums.SUMMED:
        a, b = want[column], got[column]
        if (a is None) != (b is None) or (a is not None and abs(float(a) - float(b)) > slack):
            return f"{column} {a} in the ledger, {b} in the store"
    return ""


def _first_day_mismatch(want: Mapping[str, Any], got: Mapping[str, Any] | None) -> str:
    """``_sum_mismatch`` of a day a row from a dropped day may have crossed into: one row fewer
    is that row."""
    if got is None:
        return "the store holds no row of the day" if int(want["intervals"]) > 1 else ""
    short = int(want["intervals"]) - int(got["intervals"])
    if short == 1:
        return ""
    return (
        _sum_mismatch(want, got)
        if short == 0
        else f"intervals {want['intervals']} in the ledger, {got['intervals']} in the store"
    )


def _day_number(day: str) -> int:
    """YYYY-MM-DD as days since 1970 ("": before every day)."""
    return (date.fromisoformat(day) - date(1970, 1, 1)).days if day else -(2**31)
