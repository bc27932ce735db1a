"""The interval time series of a run as rows, for CSV, JSON Lines and Parquet export.

One row per interval: GPU rows (``series`` = "gpu", one per device and interval) and host rows
(``series`` = "host"). The column list below is the documented, stable contract (docs/EXPORT.md
is checked against it by the tests); a column that does not apply to a row is empty/null.

``gpuledger export`` streams: ``stream_rows`` reads the rows from one ordered query, ``FETCH_ROWS``
at a time, and ``write_csv`` / ``write_jsonl`` / ``write_parquet_stream`` write each piece before
the next is read (Parquet in row groups of ``PARQUET_GROUP_ROWS``), so a run of any length costs
the memory of one piece: a 72-hour, 8-GPU run at 1 s (2.3 million rows) took 4.4 GB for CSV and
8.2 GB for JSON Lines when the rows were gathered first (BENCHMARKS.md). A run whose raw days
were tiered into a series store is the exception: it is read whole (store/series_tier.py).
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO

from gpuledger.core.metering.busy import unmeasured_seconds
from gpuledger.core.model import GpuIdentity, GpuInterval, HostInterval
from gpuledger.reports.safe_csv import SafeCsvWriter

if TYPE_CHECKING:
    from gpuledger.store import Ledger


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # "str", "int", "float"
    unit: str
    description: str


COLUMNS: tuple[Column, ...] = (
    Column("run_id", "str", "", "the run's UUIDv7"),
    Column("series", "str", "", "'gpu' or 'host'"),
    Column("seq", "int", "", "interval number, from 0, per run and device"),
    Column("t0", "float", "s (Unix epoch)", "interval start"),
    Column("t1", "float", "s (Unix epoch)", "interval end"),
    Column("samples", "int", "", "collector reads merged into the interval"),
    Column("gpu_index", "int", "", "GPU index as the command saw it"),
    Column("gpu_uuid", "str", "", "GPU (or MIG slice) UUID"),
    Column("gpu_name", "str", "", "GPU model name"),
    Column("busy_s", "float", "s", "GPU busy time, utilisation-weighted (integral)"),
    Column("util_method", "str", "", "'samples' (driver buffer), 'instant', or both comma-joined"),
    Column("util_max_pct", "float", "%", "highest utilisation seen"),
    Column("util_idle_s", "float", "s", "time the driver did not sample, taken as idle (samples method)"),
    Column(
        "util_unknown_s",
        "float",
        "s",
        "time the samples could not cover: measured by the instant reading, else unmeasured",
    ),
    Column(
        "util_unmeasured_s",
        "float",
        "s",
        "of util_unknown_s, the time no instant reading measured either: neither busy nor idle",
    ),
    Column("energy_j", "float", "J", "GPU energy (integral)"),
    Column("energy_method", "str", "", "'counter' (hardware counter) or 'power' (integrated)"),
    Column("power_max_w", "float", "W", "highest power draw seen"),
    Column("mem_used_max_b", "int", "B", "highest device memory used"),
    Column("mem_used_last_b", "int", "B", "device memory used at the interval's end"),
    Column("mem_reserved_b", "int", "B", "device memory reserved by the driver"),
    Column("proc_mem_max_b", "int", "B", "highest device memory held by the run's own processes"),
    Column("proc_sm_util_avg_pct", "float", "%", "the run's processes' SM utilisation, time-weighted"),
    Column("proc_method", "str", "", "how the run's processes were found: 'pid', 'cgroup', 'pidns'"),
    Column("temp_max_c", "float", "°C", "highest GPU temperature"),
    Column("sm_clock_avg_mhz", "float", "MHz", "SM clock, time-weighted mean"),
    Column("mem_clock_max_mhz", "float", "MHz", "highest memory clock"),
    Column("throttle_s", "str", "s per reason (JSON)", 'time throttled per reason, e.g. {"power": 1.5}'),
    Column("cpu_s", "float", "s", "process-tree CPU time, user + system (integral)"),
    Column("rss_max_b", "int", "B", "highest process-tree resident memory"),
    Column("read_b", "int", "B", "process-tree storage bytes read"),
    Column("write_b", "int", "B", "process-tree storage bytes written"),
    Column("threads_max", "int", "", "highest thread count of the tree"),
    Column("procs_max", "int", "", "highest process count of the tree"),
    Column("sys_cpu_util_avg_pct", "float", "%", "whole-host CPU utilisation, time-weighted"),
    Column("iowait_s", "float", "s", "host CPU time waiting for I/O (all cores)"),
    Column("sys_mem_used_max_b", "int", "B", "highest host memory used"),
    Column("disk_read_b", "int", "B", "host disk bytes read"),
    Column("disk_write_b", "int", "B", "host disk bytes written"),
    Column("net_rx_b", "int", "B", "host network bytes received"),
    Column("net_tx_b", "int", "B", "host network bytes sent"),
)
COLUMN_NAMES = tuple(c.name for c in COLUMNS)
FORMATS = ("csv", "jsonl", "parquet")
_GPU_FIELDS = [
    "busy_s",
    "util_method",
    "util_max_pct",
    "util_idle_s",
    "util_unknown_s",
    "util_unmeasured_s",
    "energy_j",
    "energy_method",
    "power_max_w",
    "mem_used_max_b",
    "mem_used_last_b",
    "mem_reserved_b",
    "proc_mem_max_b",
    "proc_sm_util_avg_pct",
    "proc_method",
    "temp_max_c",
    "sm_clock_avg_mhz",
    "mem_clock_max_mhz",
]
_HOST_FIELDS = [
    "cpu_s",
    "rss_max_b",
    "read_b",
    "write_b",
    "threads_max",
    "procs_max",
    "sys_cpu_util_avg_pct",
    "iowait_s",
    "sys_mem_used_max_b",
    "disk_read_b",
    "disk_write_b",
    "net_rx_b",
    "net_tx_b",
]


def interval_rows(
    run_id: str, devices: list[GpuIdentity], gpu: Iterable[GpuInterval], host: Iterable[HostInterval]
) -> Iterator[dict[str, object]]:
    """Rows in time order: all GPU intervals and host intervals, sorted by (t0, series, gpu_index)."""
    by_uuid = {d.uuid: d for d in devices}
    rows: list[dict[str, object]] = []
    for iv in gpu:
        row = dict.fromkeys(COLUMN_NAMES)
        dev = by_uuid.get(iv.device_uuid)
        row.update(
            run_id=run_id,
            series="gpu",
            seq=iv.seq,
            t0=iv.t0,
            t1=iv.t1,
            samples=iv.samples,
            gpu_index=dev.index if dev else None,
            gpu_uuid=iv.device_uuid,
            gpu_name=dev.name if dev else None,
        )
        row.update({f: getattr(iv, f) for f in _GPU_FIELDS})
        if iv.util_unmeasured_s is None and iv.util_unknown_s is not None:  # stored before the column
            row["util_unmeasured_s"] = unmeasured_seconds(iv)
        row["throttle_s"] = json.dumps(iv.throttle_s, sort_keys=True) if iv.throttle_s is not None else None
        rows.append(row)
    for iv in host:
        row = dict.fromkeys(COLUMN_NAMES)
        row.update(run_id=run_id, series="host", seq=iv.seq, t0=iv.t0, t1=iv.t1, samples=iv.samples)
        row.update({f: getattr(iv, f) for f in _HOST_FIELDS})
        rows.append(row)
    rows.sort(key=lambda r: (r["t0"], r["series"], r["gpu_index"] if r["gpu_index"] is not None else -1))
    return iter(rows)


NUMERIC_COLUMNS = frozenset(c.name for c in COLUMNS if c.kind != "str")


def to_csv(rows: Iterable[dict[str, object]]) -> str:
    out = io.StringIO()
    SafeCsvWriter(out, COLUMN_NAMES, NUMERIC_COLUMNS).writerows([row[c] for c in COLUMN_NAMES] for row in rows)
    return out.getvalue()


def to_jsonl(rows: Iterable[dict[str, object]]) -> str:
    return "".join(_json_line(row) for row in rows)


def write_parquet(rows: Iterable[dict[str, object]], path: str | BinaryIO) -> None:
    write_parquet_stream(([row[c] for c in COLUMN_NAMES] for row in rows), path)


# -- streaming ------------------------------------------------------------------------------------

FETCH_ROWS = 2000  # rows per database fetch, and per piece written
PARQUET_GROUP_ROWS = 128_000  # rows per Parquet row group (about 50 MB of Arrow arrays)
_THROTTLE = COLUMN_NAMES.index("throttle_s")
_ENCODER = json.JSONEncoder(allow_nan=False)  # one encoder: json.dumps(..., allow_nan=False) builds one per call


def export_query(run_id: str) -> Any:
    """The run's rows in export order: t0, then series (gpu before host), GPU index, device, seq."""
    import sqlalchemy as sa

    from gpuledger.store.server_queries import interval_export_query

    q = interval_export_query(run_id, COLUMN_NAMES)
    c = q.selected_columns
    return q.order_by(None).order_by(c.t0, c.series, sa.func.coalesce(c.gpu_index, -1), c.gpu_uuid, c.seq)


def stream_rows(ledger: Ledger, run_id: str, per_fetch: int = FETCH_ROWS) -> Iterator[list[Any]]:
    """The run's rows as lists in COLUMN_NAMES order (``throttle_s`` as sorted JSON text), in the
    order of ``interval_rows``, read ``per_fetch`` at a time from one query in one read transaction.
    Exhaust or close the iterator: it holds a database connection. A run with raw days tiered
    into the ledger's series store (``Ledger.tiered``) is read whole through the ledger instead:
    the query would miss those days."""
    from gpuledger.store.server_queries import stream

    if ledger.tiered(run_id):
        gpu, host = ledger.gpu_intervals(run_id), ledger.host_intervals(run_id)
        for row in interval_rows(run_id, ledger.devices(run_id), gpu, host):
            yield [row[c] for c in COLUMN_NAMES]
        return

    rows = stream(ledger.database, export_query(run_id), per_fetch)
    try:
        for r in rows:
            row = list(r.values())
            if row[_THROTTLE] is not None:
                row[_THROTTLE] = json.dumps(row[_THROTTLE], sort_keys=True)
            yield row
    finally:
        rows.close()  # type: ignore[attr-defined]


def _pieces(rows: Iterable[Sequence[Any]], n: int) -> Iterator[list[Sequence[Any]]]:
    piece: list[Sequence[Any]] = []
    for row in rows:
        piece.append(row)
        if len(piece) >= n:
            yield piece
            piece = []
    if piece:
        yield piece


def write_csv(rows: Iterable[Sequence[Any]], out: TextIO) -> None:
    """CSV to ``out`` piece by piece: the same text as ``to_csv`` (absent is an empty field; a device
    name that a spreadsheet would take as a formula neutralised, reports/safe_csv.py)."""
    writer = SafeCsvWriter(out, COLUMN_NAMES, NUMERIC_COLUMNS)
    for piece in _pieces(rows, FETCH_ROWS):
        writer.writerows(piece)


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _json_line(row: dict[str, Any]) -> str:
    """One strict JSON line; a non-finite number (JSON has none) is null, as an absent reading."""
    try:
        return _ENCODER.encode(row) + "\n"
    except ValueError:
        return _ENCODER.encode({k: _finite(v) for k, v in row.items()}) + "\n"


def write_jsonl(rows: Iterable[Sequence[Any]], out: TextIO) -> None:
    """JSON Lines to ``out`` piece by piece: the same text as ``to_jsonl``."""
    for piece in _pieces(rows, FETCH_ROWS):
        out.write("".join(_json_line(dict(zip(COLUMN_NAMES, row, strict=True))) for row in piece))


def write_parquet_stream(rows: Iterable[Sequence[Any]], path: str | BinaryIO) -> None:
    """Parquet to ``path`` in row groups of PARQUET_GROUP_ROWS, each built from pieces of FETCH_ROWS
    rows and written before the next is read."""
    from gpuledger.extras import require

    pa = require("pyarrow", extra="parquet", purpose="Parquet export")
    pq = require("pyarrow.parquet", extra="parquet", purpose="Parquet export")
    types = {"str": pa.string(), "int": pa.int64(), "float": pa.float64()}
    schema = pa.schema([pa.field(c.name, types[c.kind]) for c in COLUMNS])
    batches: list[Any] = []
    pending, written = 0, False
    with pq.ParquetWriter(path, schema) as writer:
        for piece in _pieces(rows, FETCH_ROWS):
            arrays = [pa.array(col, f.type) for col, f in zip(zip(*piece, strict=True), schema, strict=True)]
            batches.append(pa.record_batch(arrays, schema=schema))
            pending += len(piece)
            if pending >= PARQUET_GROUP_ROWS:
                writer.write_table(pa.Table.from_batches(batches, schema).combine_chunks())
                batches, pending, written = [], 0, True
        if batches or not written:  # the rest; a run without intervals still gets its (empty) table
            writer.write_table(pa.Table.from_batches(batches, schema).combine_chunks())
