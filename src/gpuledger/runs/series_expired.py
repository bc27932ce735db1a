"""The summary of a series-only run whose series store dropped some of its days past its window
(store/series_only_window.py): its raw curves of those days are gone, so ``show`` and ``report
run`` take its figures from the ledger's day sums (busy time, energy and interval counts per GPU,
whole) instead of from the rows the store still keeps, and say so (``series_expired``)."""

from __future__ import annotations

from typing import Any

from gpuledger.core.metering.summary import summarize
from gpuledger.core.model import GpuIdentity, RunRecord
from gpuledger.store.series_only_window import expired_note


def summary(ledger: Any, run: RunRecord, devices: list[GpuIdentity], now: float) -> dict[str, Any] | None:
    """The run's summary from its day sums with ``series_expired`` (the days and a note); None
    unless it is a series-only run some of whose days its store dropped."""
    days = ledger.series_expired_days(run.id)
    if not days:
        return None
    gpu, counts = ledger.series_day_intervals(run.id)
    data = summarize(run, devices, gpu, [], now=now, counts={**counts, "host": 0})
    data["series_expired"] = {"days": days, "note": expired_note(days)}
    return data
