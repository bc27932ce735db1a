"""What every raw-series store does (docs/SCALE.md): the server writes a run's intervals once
(idempotently), reads one run's intervals back by key, sums them per run, GPU and UTC day for the
rollups, and drops whole days past the raw window."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, Protocol

Row = Mapping[str, Any]


@dataclass(frozen=True)
class DayRollup:
    """One run's use of one GPU on one UTC day: the sums chargeback and capacity read instead of
    the raw intervals. Times in seconds, energy in joules, as the ledger's rollups."""

    run_id: str
    device_uuid: str
    day: date
    intervals: int
    samples: int
    allocated_s: float
    busy_s: float | None
    idle_s: float | None
    unknown_s: float | None
    unmeasured_s: float | None
    energy_j: float | None


class SeriesStore(Protocol):
    def create(self) -> None:
        """Create what is missing (tables, views); safe to call on every start."""

    def write(self, run_id: str, gpu: Sequence[Row], host: Sequence[Row], token: str) -> int:
        """Store intervals given as ledger rows (``gpu_intervals`` / ``host_intervals`` columns
        without ``run_id``). ``token`` names the batch: the same token again stores nothing.
        Returns the number of rows stored by this call."""

    def gpu_intervals(self, run_id: str, device_uuid: str | None = None) -> list[dict[str, Any]]:
        """The run's GPU intervals in (device, seq) order, as quantum.quantize_gpu of what was written."""

    def host_intervals(self, run_id: str) -> list[dict[str, Any]]:
        """The run's host intervals in seq order, as quantum.quantize_host of what was written."""

    def gpu_devices(self, run_id: str) -> list[str]:
        """The UUIDs of the GPUs the store holds rows of the run for, sorted."""

    def gpu_page(self, run_id: str, device_uuid: str, after_seq: int, limit: int) -> list[dict[str, Any]]:
        """The run's rows of one GPU with seq > ``after_seq``, in seq order, as ``gpu_intervals``:
        the first ``limit`` and any more of the last one's seq, so the next page starts after it
        (store/series_compact_read.py reads a run so, never all of it at once)."""

    def host_page(self, run_id: str, after_seq: int, limit: int) -> list[dict[str, Any]]:
        """The run's host rows with seq > ``after_seq``, in seq order, as ``gpu_page``."""

    def write_capacity(self, rows: Sequence[Row], token: str) -> int:
        """Store node agents' capacity intervals (``gpu_capacity`` rows, series/capacity.py) once:
        the same token again, or a row whose (GPU, start) is held, stores nothing. Rows stored."""

    def capacity_intervals(self, gpu_uuids: Sequence[str], t_from_ms: int, t_to_ms: int) -> list[dict[str, Any]]:
        """The capacity intervals of ``gpu_uuids`` that start in [t_from_ms, t_to_ms), in (GPU,
        start) order, as series/capacity.quantize of what was written."""

    def day_rollups(self, t_from: float, t_to: float) -> list[DayRollup]:
        """Per run, GPU and UTC day, over the days that overlap [t_from, t_to)."""

    def drop_days_before(self, day: date) -> int:
        """Drop every raw day before ``day`` whole (no row-by-row DELETE); the number of days dropped."""

    def raw_days(self) -> list[date]:
        """The UTC days the store holds raw rows of (or a partition for), oldest first."""

    def bytes_at_rest(self) -> int:
        """Bytes the GPU intervals take on disk, compressed, indexes included."""

    def close(self) -> None: ...
