"""A run's raw intervals read whole when some of its days were tiered into a series store and
dropped from the ledger (store/series_tier.py): the store's rows merged with those the ledger
still holds (the ledger's copy wins where both hold an interval). Used by ``Ledger`` when it is
opened with ``series=``; the store is opened on the first read, never created or changed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuledger.core.model import GpuInterval, HostInterval
from gpuledger.series.base import SeriesStore
from gpuledger.store import codec


class TieredReads:
    def __init__(self, series: str | SeriesStore) -> None:
        self._url = series if isinstance(series, str) else None
        self._store = None if isinstance(series, str) else series

    @property
    def store(self) -> SeriesStore:
        if self._store is None:
            from gpuledger.store.series_tier import open_store

            assert self._url is not None
            self._store = open_store(self._url, create=False)
        return self._store

    def gpu(self, run_id: str, device_uuid: str | None, held: Sequence[GpuInterval]) -> list[GpuInterval]:
        keys = {(g.device_uuid, g.seq) for g in held}
        tiered = [
            codec.gpu_from_row(_with_run(r, run_id))
            for r in self.store.gpu_intervals(run_id, device_uuid)
            if (r["device_uuid"], r["seq"]) not in keys
        ]
        return sorted([*held, *tiered], key=lambda g: (g.device_uuid, g.seq)) if tiered else list(held)

    def host(self, run_id: str, held: Sequence[HostInterval]) -> list[HostInterval]:
        seqs = {h.seq for h in held}
        tiered = [
            codec.host_from_row(_with_run(r, run_id)) for r in self.store.host_intervals(run_id) if r["seq"] not in seqs
        ]
        return sorted([*held, *tiered], key=lambda h: h.seq) if tiered else list(held)

    @property
    def windowed(self) -> bool:
        """Whether the store reads a time window of a run (``gpu_intervals_between``,
        ``host_intervals_between``: series/postgres.py, series/clickhouse.py), not only the whole run."""
        return callable(getattr(self.store, "gpu_intervals_between", None)) and callable(
            getattr(self.store, "host_intervals_between", None)
        )

    def gpu_between(self, run_id: str, t_from: float, t_to: float) -> list[GpuInterval]:
        """The store's GPU rows of the run with t1 > t_from and t0 < t_to (``windowed`` stores)."""
        rows = self.store.gpu_intervals_between(run_id, t_from, t_to)  # type: ignore[attr-defined]
        return [codec.gpu_from_row(_with_run(r, run_id)) for r in rows]

    def host_between(self, run_id: str, t_from: float, t_to: float) -> list[HostInterval]:
        rows = self.store.host_intervals_between(run_id, t_from, t_to)  # type: ignore[attr-defined]
        return [codec.host_from_row(_with_run(r, run_id)) for r in rows]

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def _with_run(row: dict[str, Any], run_id: str) -> dict[str, Any]:
    return {**row, "run_id": run_id}
