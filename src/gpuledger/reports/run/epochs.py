"""The per-epoch view of a run: training metrics beside the resources of exactly that epoch.

``epoch_table(ledger, run)`` gives one row per epoch (and one per non-epoch phase: setup, between
epochs, final validation ...), in time order, for ``gpuledger show`` (text via
``format_epoch_table``, JSON as the ``epochs`` key). ``export_rows`` flattens the same rows for
``gpuledger export RUN --metrics`` (CSV, JSON Lines, Parquet).
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

from gpuledger.core.model import Metric, RunRecord
from gpuledger.core.training import epochs as core_epochs
from gpuledger.core.units import fmt_number
from gpuledger.reports.safe_csv import SafeCsvWriter

if TYPE_CHECKING:
    from gpuledger.store import Ledger

RESOURCE_KEYS = (
    "wall_s",
    "train_s",
    "images",
    "images_per_s",
    "gpu_busy_s",
    "gpu_energy_j",
    "gpu_mem_peak_b",
    "proc_gpu_mem_peak_b",
    "cpu_s",
    "rss_peak_b",
)


def metrics_by_epoch(metrics: Iterable[Metric]) -> dict[int, dict[str, float]]:
    """Epoch -> {key: value}; the last value of a key in an epoch wins."""
    out: dict[int, dict[str, float]] = {}
    for m in metrics:
        if m.epoch is not None:
            out.setdefault(m.epoch, {})[m.key] = m.value
    return out


def _row(u: core_epochs.SpanUsage, metrics: dict[str, float] | None) -> dict[str, Any]:
    row: dict[str, Any] = {"phase": u.phase, "epoch": u.epoch, "t0": u.t0, "t1": u.t1}
    row.update({k: getattr(u, k) for k in RESOURCE_KEYS})
    row["exact"] = u.exact
    row["metrics"] = dict(metrics or {})
    return row


def epoch_table(ledger: Ledger, run: RunRecord, now: float | None = None) -> list[dict[str, Any]]:
    """Rows: ``phase`` ("setup", "epoch", "between epochs", ...), ``epoch`` (1-based or None),
    ``t0``/``t1``, resources (RESOURCE_KEYS; None = not measured), ``exact`` (no interval had to be
    split at this row's edges), ``metrics`` (the epoch's training metrics).

    Empty when the run has no epochs at all. Epochs known only from metrics (imported runs, runs
    parsed from their log) have no resource figures.
    """
    import time

    by_epoch = metrics_by_epoch(ledger.metrics(run.id))
    events = ledger.events(run.id)
    has_marks = any(e.kind in core_epochs.BOUNDARY_KINDS for e in events)
    if not by_epoch and not has_marks:
        return []
    rows: list[dict[str, Any]] = []
    if has_marks:
        end = run.ended_at or ledger.last_flush_t(run.id) or (time.time() if now is None else now)
        usage = core_epochs.account(
            events, ledger.gpu_intervals(run.id), ledger.host_intervals(run.id), run.started_at, end
        )
        rows = [
            _row(u, by_epoch.get(u.epoch) if u.epoch is not None else None) for u in core_epochs.merge_phases(usage)
        ]
    seen = {r["epoch"] for r in rows if r["phase"] == core_epochs.EPOCH}
    for epoch in sorted(set(by_epoch) - seen):
        empty = core_epochs.SpanUsage(core_epochs.EPOCH, epoch, math.nan, math.nan, math.nan)
        row = _row(empty, by_epoch[epoch])
        row.update(t0=None, t1=None, wall_s=None, exact=False)
        rows.append(row)
    rows.sort(key=_order)
    return rows


def _order(row: dict[str, Any]) -> tuple[int, float]:
    if row["phase"] == core_epochs.SETUP:
        return (0, 0.0)
    if row["phase"] == core_epochs.EPOCH:
        return (1, float(row["epoch"] if row["epoch"] is not None else math.inf))
    return (2, row["t0"] if row["t0"] is not None else math.inf)


# -- text ----------------------------------------------------------------------------------

# Metrics shown in the text table, in order of preference (JSON and export have them all).
_PREFERRED = (
    "metrics/mAP50-95(B)",
    "metrics/mAP50(B)",
    "metrics/mAP50-95(M)",
    "metrics/mAP50-95(P)",
    "metrics/accuracy_top1",
    "metrics/accuracy_top5",
    "metrics/mAP_0.5:0.95",
    "metrics/mAP_0.5",
    "train/box_loss",
    "train/cls_loss",
    "train/loss",
    "val/box_loss",
    "val/loss",
)
MAX_METRIC_COLUMNS = 5
# results.csv's "time" is the epoch's wall clock (Ultralytics 8.1+), shown as "wall s" already;
# "epoch" is the row itself.
NOT_TRAINING_METRICS = frozenset({"time", "epoch"})
# Other YOLO columns (the rest of the losses, precision, recall, the learning rates) stay in
# --json and export: the table keeps room for metrics a user logged themselves.
_YOLO_PREFIXES = ("metrics/", "train/", "val/", "lr/")


@dataclass(frozen=True)
class _Col:
    title: str
    get: Any  # row -> text


def _num(value: Any) -> str:
    """A figure of the table (units.py policy); absent is "-", a NaN metric (a diverged loss) "nan"."""
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return fmt_number(value)


def _metric(value: Any) -> str:
    """A training metric: four significant digits (a loss of 0.02513 or an mAP of 0.4127 needs them)."""
    return _num(value) if value is None or (isinstance(value, float) and math.isnan(value)) else fmt_number(value, 4)


def _mib(value: Any) -> str:
    return "-" if value is None else f"{value / 2**20:,.0f}"


def metric_columns(rows: Sequence[dict[str, Any]], limit: int = MAX_METRIC_COLUMNS) -> list[str]:
    """The metrics a table shows: the telling YOLO ones first (_PREFERRED), then any other metric
    the run logged (``track().log_metric``), in order of first appearance, up to ``limit``."""
    seen: list[str] = []
    for r in rows:
        seen += [k for k in r["metrics"] if k not in seen and k not in NOT_TRAINING_METRICS]
    preferred = [k for k in _PREFERRED if k in seen]
    # In a YOLO run the other YOLO columns are left out; any run's own metrics keep some room.
    own = [k for k in seen if k not in preferred and not (preferred and k.startswith(_YOLO_PREFIXES))]
    return (preferred[: max(2, limit - len(own))] + own)[:limit]


def _label(row: dict[str, Any]) -> str:
    return str(row["epoch"]) if row["phase"] == core_epochs.EPOCH else row["phase"]


def format_epoch_table(
    rows: Sequence[dict[str, Any]], grid: Callable[[list[list[str]]], list[str]] | None = None
) -> str:
    """A fixed-width table: phase/epoch, resources, then the most telling metrics; a total line.
    ``grid`` lays the cells out instead (the CLI's fits a terminal; header, rows, then notes)."""
    if not rows:
        return ""
    gpu = any(r["gpu_busy_s"] is not None for r in rows)
    measured = any(r["wall_s"] is not None for r in rows)  # not so for imported or log-parsed runs
    cols = [_Col("epoch", _label)]
    if measured:
        cols += [
            _Col("wall s", lambda r: _num(r["wall_s"])),
            _Col("img/s", lambda r: _num(r["images_per_s"])),
        ]
    if gpu:
        cols += [
            _Col("GPU busy s", lambda r: _num(r["gpu_busy_s"])),
            _Col("energy Wh", lambda r: _num(None if r["gpu_energy_j"] is None else r["gpu_energy_j"] / 3600)),
            _Col("VRAM MiB", lambda r: _mib(r["gpu_mem_peak_b"])),
        ]
    if measured:
        cols += [
            _Col("CPU s", lambda r: _num(r["cpu_s"])),
            _Col("RSS MiB", lambda r: _mib(r["rss_peak_b"])),
        ]
    for key in metric_columns(rows):
        title = key.removeprefix("metrics/")
        cols.append(_Col(title, lambda r, k=key: _metric(r["metrics"].get(k))))
    shown = [r for r in rows if r["phase"] == core_epochs.EPOCH or not _negligible(r)]
    if measured:
        shown.append(_total_row(rows))
    cells = [[c.title for c in cols]] + [[c.get(r) for c in cols] for r in shown]
    widths = [max(len(line[i]) for line in cells) for i in range(len(cols))]
    lines = grid(cells) if grid else [
        "  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(line, widths, strict=True)))
        for line in cells
    ]  # fmt: skip
    if measured:
        lines.insert(len(shown), "-" * len(lines[0]))
    if not all(r["exact"] for r in rows if r["wall_s"] is not None):
        lines.append("(some intervals were split between epochs in proportion to time: figures approximate)")
    return "\n".join(lines)


def _negligible(row: dict[str, Any]) -> bool:
    """A phase too short to have its own figures (e.g. the instant between two epochs)."""
    return (row["wall_s"] or 0.0) < 0.05 and row["cpu_s"] is None and row["gpu_busy_s"] is None


def _total_row(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    def total(key: str) -> float | None:
        values = [r[key] for r in rows if r[key] is not None]
        return sum(values) if values else None

    def peak(key: str) -> float | None:
        values = [r[key] for r in rows if r[key] is not None]
        return max(values) if values else None

    return {
        "phase": "total",
        "epoch": None,
        "wall_s": total("wall_s"),
        "images_per_s": None,
        "gpu_busy_s": total("gpu_busy_s"),
        "gpu_energy_j": total("gpu_energy_j"),
        "gpu_mem_peak_b": peak("gpu_mem_peak_b"),
        "cpu_s": total("cpu_s"),
        "rss_peak_b": peak("rss_peak_b"),
        "metrics": {},
    }


# -- export --------------------------------------------------------------------------------

# The fixed columns of ``gpuledger export RUN --metrics`` (docs/YOLO.md lists them; a test checks it):
# name, type, unit, meaning. The run's metric keys follow, in order of first appearance.
EXPORT_COLUMNS: tuple[tuple[str, str, str, str], ...] = (
    ("run_id", "str", "", "the run's id"),
    ("phase", "str", "", "'epoch', or 'setup', 'between epochs', 'final validation', 'after training'"),
    ("epoch", "int", "", "epoch number, 1-based as in results.csv (empty for other phases)"),
    ("t0", "float", "s (Unix epoch)", "start of the span"),
    ("t1", "float", "s (Unix epoch)", "end of the span"),
    ("wall_s", "float", "s", "wall time of the span"),
    ("train_s", "float", "s", "the epoch's training part, without its validation"),
    ("images", "int", "", "training images in the epoch"),
    ("images_per_s", "float", "1/s", "training throughput: images / train_s"),
    ("gpu_busy_s", "float", "s", "GPU busy time, summed over the run's GPUs (integral)"),
    ("gpu_energy_j", "float", "J", "GPU energy, summed over the run's GPUs (integral)"),
    ("gpu_mem_peak_b", "int", "B", "highest device memory used, any GPU"),
    ("proc_gpu_mem_peak_b", "int", "B", "highest GPU memory held by the run's processes"),
    ("cpu_s", "float", "s", "process-tree CPU time, user + system (integral)"),
    ("rss_peak_b", "int", "B", "highest process-tree resident memory"),
    ("exact", "bool", "", "true when no interval had to be shared with a neighbouring span"),
)
FIXED_COLUMNS = tuple(c[0] for c in EXPORT_COLUMNS)
_KINDS = {c[0]: c[1] for c in EXPORT_COLUMNS}


METRIC_PREFIX = "metric:"  # a metric named like a fixed column is exported under this prefix


def metric_column_names(keys: Sequence[str]) -> dict[str, str]:
    """Metric key -> export column. The fixed columns win: a metric named like one (a user's own
    ``images``, ``wall_s``) becomes ``metric:<name>`` (and again, should that be taken too)."""
    taken = set(FIXED_COLUMNS) | set(keys)
    out: dict[str, str] = {}
    for key in keys:
        name = key
        if name in FIXED_COLUMNS:
            name = METRIC_PREFIX + key
            while name in taken:
                name = METRIC_PREFIX + name
            taken.add(name)
        out[key] = name
    return out


def export_rows(run_id: str, rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """(columns, flat rows): FIXED_COLUMNS, then every training metric key in order of first
    appearance (NOT_TRAINING_METRICS left out, as in the tables and charts; names: metric_column_names)."""
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r["metrics"] if k not in keys and k not in NOT_TRAINING_METRICS]
    names = metric_column_names(keys)
    columns = [*FIXED_COLUMNS, *names.values()]
    flat = []
    for r in rows:
        row = {c: r.get(c) for c in FIXED_COLUMNS}
        row["run_id"] = run_id
        row.update({names[k]: r["metrics"].get(k) for k in keys})
        flat.append(row)
    return columns, flat


def to_csv(columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> str:
    """Text cells, and metric names in the header, that a spreadsheet would take as a formula are
    neutralised (reports/safe_csv.py); metric columns are numeric."""
    out = io.StringIO()
    writer = SafeCsvWriter(out, columns, {c for c in columns if _KINDS.get(c, "float") != "str"})
    writer.writerows([row.get(c) for c in columns] for row in rows)
    return out.getvalue()


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan" / "inf": JSON has no NaN; a NaN loss is a result worth keeping
    return value


def to_jsonl(columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> str:
    return "".join(json.dumps({c: _json_safe(r.get(c)) for c in columns}, allow_nan=False) + "\n" for r in rows)


def write_parquet(columns: Sequence[str], rows: Iterable[dict[str, Any]], path: str | BinaryIO) -> None:
    from gpuledger.extras import require

    pa = require("pyarrow", extra="parquet", purpose="Parquet export")
    pq = require("pyarrow.parquet", extra="parquet", purpose="Parquet export")

    types = {"str": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}

    def kind(c: str) -> Any:
        return types[_KINDS.get(c, "float")]  # metric columns are floats

    materialised = list(rows)
    schema = pa.schema([pa.field(c, kind(c)) for c in columns])
    table = pa.table({c: [r.get(c) for r in materialised] for c in columns}, schema=schema)
    pq.write_table(table, path)


# -- gpuledger show --------------------------------------------------------------------------


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def show_text(ledger: Ledger, run: RunRecord, grid: Callable[[list[list[str]]], list[str]] | None = None) -> str:
    """The sections ``gpuledger show`` adds for a run with epochs or attempts ("" when none)."""
    from gpuledger.runs.attempts import attempt_chain, format_chain

    parts = []
    rows = epoch_table(ledger, run)
    if rows:
        parts.append("Epochs\n" + format_epoch_table(rows, grid))
    chain = attempt_chain(ledger, run.id)
    if len(chain["attempts"]) > 1:
        parts.append(format_chain(chain))
    return "\n\n".join(parts)


def show_json(ledger: Ledger, run: RunRecord) -> dict[str, Any]:
    """``epochs`` (epoch_table rows, NaN as "nan") and ``attempts`` (attempt_chain, or None when
    the run is its only attempt), for ``gpuledger show --json``."""
    from gpuledger.runs.attempts import attempt_chain

    chain = attempt_chain(ledger, run.id)
    return {
        "epochs": [_finite(r) for r in epoch_table(ledger, run)],
        "attempts": chain if len(chain["attempts"]) > 1 else None,
    }
