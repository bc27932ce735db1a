"""The value of recently ended runs, read from a ledger: the value gauges of the server's /metrics.

Runs that ended within ``recent_s`` (the same hour the run series stay in the scrape), carry a
model or model_version label and were metered (not imported); newest first, at most ``max_runs``.
Each is priced once per process with the server's rate card (reports/cost/value_trends.py: as the
chargeback prices it, a rolled-up run from its rollups, reports/cost/run_rollups.py) and kept: an
ended run's figures do not change, so a scrape reads only the list of runs and prices the runs it
has not seen. A run whose end or status changes is priced again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuledger.core.chargeback.value_trends import group_of
from gpuledger.core.money import money_decimal
from gpuledger.prom.ledger_source import MAX_RUNS, RECENT_S
from gpuledger.prom.series import RunKey
from gpuledger.prom.value_families import RunValueFigures
from gpuledger.store import value_queries as vq

if TYPE_CHECKING:
    from gpuledger.core.chargeback.value_trends import RunValue
    from gpuledger.core.pricing.ratecard import RateCard
    from gpuledger.store import Ledger

_UH_TO_S = 0.0036  # one micro-GPU-hour in seconds


def figures_of(row: dict[str, Any], value: RunValue) -> RunValueFigures:
    """A run row (value_queries.finished_model_runs) and its value as gauge figures."""
    measured = value.measured_uh * _UH_TO_S if value.measured_uh > 0 else None
    return RunValueFigures(
        key=RunKey(row["id"], row["project"] or "", row["team"] or "", row["user"] or ""),
        model=value.model or "",
        model_version=group_of(value, "model_version") or "",
        status=value.status,
        cost=float(money_decimal(value.cost)),
        idle_cost=float(money_decimal(value.idle_cost)),
        epochs=value.epochs,
        train_images=value.images_seen or None,
        map50_95_gain=None if value.map50_95 is None else float(value.map_points) / 100,
        busy_gpu_s=None if measured is None else value.busy_uh * _UH_TO_S,
        measured_gpu_s=measured,
    )


class ValueSource:
    """Thread-safe; ``figures(scope)`` is called once per scrape."""

    def __init__(
        self,
        ledger: Ledger,
        card: RateCard,
        *,
        basis: str | None = None,
        recent_s: float = RECENT_S,
        max_runs: int = MAX_RUNS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._ledger, self._card, self._basis = ledger, card, basis
        self.recent_s, self.max_runs, self._clock = recent_s, max_runs, clock
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, float, str], RunValueFigures] = {}
        self.priced = 0  # runs priced by the last call (the cost of a scrape)

    def figures(self, scope: frozenset[str] | None = None) -> list[RunValueFigures]:
        from gpuledger.reports.cost.value_trends import values_of

        with self._lock:
            now = self._clock()
            rows = self._ledger.read(
                lambda conn: vq.finished_model_runs(
                    conn, scope=scope, start=now - self.recent_s, end=now + 1, limit=self.max_runs
                )
            )
            keys = [(r["id"], float(r["ended_at"]), r["status"]) for r in rows]
            new = [r for r, k in zip(rows, keys, strict=True) if k not in self._cache]
            for row, value in zip(new, values_of(self._ledger, new, card=self._card, basis=self._basis), strict=True):
                self._cache[(row["id"], float(row["ended_at"]), row["status"])] = figures_of(row, value)
            self.priced = len(new)
            if len(self._cache) > 2 * self.max_runs:  # runs that left the window
                wanted = set(keys)
                self._cache = {k: v for k, v in self._cache.items() if k in wanted}
            return [self._cache[k] for k in keys]
