"""``gpuledger export``: rows streamed from the database to the file (never all held at once), the
same bytes as before streaming, non-finite readings as null, and ``--metrics`` columns that a
run's own metric cannot overwrite."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ci_support import need_module
from diag_support import T0, device, gpu_intervals, host_intervals
from gpuledger.cli.main import cli
from gpuledger.core.model import Event, GpuIdentity, Metric, RunRecord
from gpuledger.reports.run import export
from gpuledger.store import Ledger

RUN = "0190eeee-0000-7000-8000-000000000001"


def _run(ledger: Ledger, run_id: str = RUN, n: int = 60, gpus: int = 2, step: float = 5.0, **kw: Any) -> None:
    ledger.create_run(
        RunRecord(
            id=run_id,
            command=["python", "train.py"],
            user="ana",
            host="box",
            cwd="/w",
            started_at=T0,
            status="succeeded",
            ended_at=T0 + n * step,
            exit_code=0,
        )
    )
    devs = [device(i) for i in range(gpus)]
    ledger.add_devices(run_id, devs)
    for d in devs:
        ivs = gpu_intervals(d.uuid, n, step, throttle=lambda i: {"thermal": 1.5, "power": 0.25} if i % 7 == 0 else {})
        ivs = [replace(iv, proc_mem_max_b=None, util_idle_s=None) if i % 5 == 0 else iv for i, iv in enumerate(ivs)]
        ledger.append(run_id, gpu=ivs)
    ledger.append(run_id, host=host_intervals(n, step, iowait=lambda i: None if i % 3 == 0 else 0.1))
    for k, v in kw.items():
        ledger.append(run_id, **{k: v})


def _cli(url: str, *args: str) -> str:
    result = CliRunner().invoke(cli, [*args, "--db", url], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture
def url(ledger_url: str) -> str:
    """The same run on SQLite and PostgreSQL (a server-side cursor there)."""
    url = ledger_url
    with Ledger(url) as ledger:
        _run(ledger)
        # Two devices with the same index (a MIG slice listed beside its parent): ties keep the
        # device order the export always had.
        twin = GpuIdentity(index=0, uuid="GPU-aaaa-twin", name="NVIDIA A100 MIG 1g.10gb", memory_total_b=10 * 2**30)
        ledger.add_devices(RUN, [twin])
        ledger.append(RUN, gpu=gpu_intervals(twin.uuid, 60, 5.0))
    return url


def _before_streaming(url: str, run_id: str = RUN) -> list[dict[str, object]]:
    """The rows as the export gathered them before it streamed (interval_rows over every interval)."""
    with Ledger(url) as led:
        return list(
            export.interval_rows(run_id, led.devices(run_id), led.gpu_intervals(run_id), led.host_intervals(run_id))
        )


# -- the same output --------------------------------------------------------------------------------


def test_csv_and_jsonl_are_the_bytes_they_were_before_streaming(url: str, tmp_path: Path) -> None:
    rows = _before_streaming(url)
    assert len(rows) == 60 * 4
    assert _cli(url, "export", RUN) == export.to_csv(rows)
    assert _cli(url, "export", RUN, "--format", "jsonl") == export.to_jsonl(rows)
    _cli(url, "export", RUN, "-o", str(tmp_path / "run.csv"))
    assert (tmp_path / "run.csv").read_text() == export.to_csv(rows)


def test_parquet_holds_the_same_rows_and_types(url: str, tmp_path: Path) -> None:
    pq = need_module("pyarrow.parquet", "the parquet extra: pip install 'gpuledger[parquet]'")
    _cli(url, "export", RUN, "--format", "parquet", "-o", str(tmp_path / "run.parquet"))
    table = pq.read_table(tmp_path / "run.parquet")
    assert table.column_names == list(export.COLUMN_NAMES)
    assert table.to_pylist() == _before_streaming(url)


def test_a_run_without_intervals_exports_just_the_header(tmp_path: Path) -> None:
    pq = need_module("pyarrow.parquet", "the parquet extra: pip install 'gpuledger[parquet]'")
    url = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger(url) as ledger:
        _run(ledger, n=0)
    assert _cli(url, "export", RUN) == ",".join(export.COLUMN_NAMES) + "\n"
    assert _cli(url, "export", RUN, "--format", "jsonl") == ""
    _cli(url, "export", RUN, "--format", "parquet", "-o", str(tmp_path / "empty.parquet"))
    table = pq.read_table(tmp_path / "empty.parquet")
    assert table.num_rows == 0 and table.column_names == list(export.COLUMN_NAMES)


# -- streaming ----------------------------------------------------------------------------------


class _Cursor:
    """Wraps store.server_queries.stream: counts the rows the database has handed over."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from gpuledger.store import server_queries

        self.pulled = 0
        real = server_queries.stream

        def stream(*args: Any, **kw: Any) -> Iterator[Any]:
            for row in real(*args, **kw):
                self.pulled += 1
                yield row

        monkeypatch.setattr(server_queries, "stream", stream)


class _Sink(io.StringIO):
    """An output file that notes how many rows the cursor had handed over at each write."""

    def __init__(self, cursor: _Cursor) -> None:
        super().__init__()
        self.cursor = cursor
        self.seen: list[tuple[int, int]] = []  # (rows pulled from the database, lines written so far)

    def write(self, text: str) -> int:
        self.seen.append((self.cursor.pulled, self.getvalue().count("\n")))
        return super().write(text)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_export_writes_rows_while_the_query_is_still_being_read(
    url: str, tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export, "FETCH_ROWS", 25)
    cursor = _Cursor(monkeypatch)
    sinks: list[_Sink] = []
    real = export.write_csv if fmt == "csv" else export.write_jsonl

    def spy(rows: Any, out: Any) -> None:
        sink = _Sink(cursor)
        sinks.append(sink)
        real(rows, sink)
        out.write(sink.getvalue())

    monkeypatch.setattr(export, "write_csv" if fmt == "csv" else "write_jsonl", spy)
    _cli(url, "export", RUN, "--format", fmt, "-o", str(tmp_path / f"run.{fmt}"))
    total = 60 * 4
    assert cursor.pulled == total
    header = 1 if fmt == "csv" else 0
    pieces = [(pulled, lines - header) for pulled, lines in sinks[0].seen if lines > header or pulled]
    assert pieces[0][0] < total  # the first rows were written before the query was read to its end
    # Never more than one piece (FETCH_ROWS rows) read and not yet written:
    assert max(pulled - written for pulled, written in pieces) <= 25


def test_parquet_writes_row_groups_while_the_query_is_still_being_read(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pq = need_module("pyarrow.parquet", "the parquet extra: pip install 'gpuledger[parquet]'")
    monkeypatch.setattr(export, "FETCH_ROWS", 10)
    monkeypatch.setattr(export, "PARQUET_GROUP_ROWS", 50)
    cursor = _Cursor(monkeypatch)
    groups: list[tuple[int, int]] = []
    real = pq.ParquetWriter.write_table

    def write_table(self: Any, table: Any, *args: Any, **kw: Any) -> None:
        groups.append((cursor.pulled, table.num_rows))
        real(self, table, *args, **kw)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_table)
    _cli(url, "export", RUN, "--format", "parquet", "-o", str(tmp_path / "run.parquet"))
    assert [n for _, n in groups] == [50, 50, 50, 50, 40]
    assert cursor.pulled == 240  # every row came from the database cursor ...
    assert 50 <= groups[0][0] < 240  # ... and the first row group left before the last row was read
    assert pq.ParquetFile(tmp_path / "run.parquet").metadata.num_row_groups == 5
    assert pq.read_table(tmp_path / "run.parquet").to_pylist() == _before_streaming(url)


def _traced_peak(url: str, run_id: str, fmt: str, path: Path) -> int:
    """Python's peak allocations while ``gpuledger export`` writes the run to ``path``."""
    import tracemalloc

    tracemalloc.start()
    try:
        _cli(url, "export", run_id, "--format", fmt, "-o", str(path))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_export_memory_does_not_grow_with_the_run(tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """10,000 and 40,000 rows: gathered first, the bigger one took four times the memory (about
    2 KB a row); streamed, both take the same few MB (tracemalloc, Python's own allocations)."""
    monkeypatch.setattr(export, "FETCH_ROWS", 500)
    url = f"sqlite:///{tmp_path}/ledger.db"
    small, big = "0190eeee-0000-7000-8000-0000000000a1", "0190eeee-0000-7000-8000-0000000000a2"
    with Ledger(url) as ledger:
        _run(ledger, small, n=2_500, gpus=3, step=1.0)  # x (3 GPUs + host) = 10,000 rows
        _run(ledger, big, n=10_000, gpus=3, step=1.0)  # 40,000 rows
    peak_small = _traced_peak(url, small, fmt, tmp_path / f"small.{fmt}")
    peak_big = _traced_peak(url, big, fmt, tmp_path / f"big.{fmt}")
    with open(tmp_path / f"big.{fmt}", encoding="utf-8") as fh:
        assert sum(1 for _ in fh) == 40_000 + (fmt == "csv")
    assert peak_big < 4 * 2**20, f"peak {peak_big / 2**20:.1f} MiB for 40,000 rows"
    assert peak_big < 1.5 * peak_small + 2**20, (peak_small, peak_big)


# -- non-finite readings ------------------------------------------------------------------------


def test_jsonl_writes_a_non_finite_reading_as_null(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger(url) as ledger:
        _run(ledger, n=0)
        ivs = gpu_intervals("GPU-test-0", 5)
        ivs[2] = replace(ivs[2], temp_max_c=math.inf, power_max_w=-math.inf)
        ledger.append(RUN, gpu=ivs)
    lines = [json.loads(line) for line in _cli(url, "export", RUN, "--format", "jsonl").splitlines()]
    bad = next(r for r in lines if r["seq"] == 2)
    assert bad["temp_max_c"] is None and bad["power_max_w"] is None
    assert bad["busy_s"] == 4.5 and lines[0]["temp_max_c"] == 60.0


# -- export --metrics -----------------------------------------------------------------------------


@pytest.fixture
def metrics_url(tmp_path: Path) -> str:
    """A run whose own metrics are named like fixed columns (images, wall_s), plus the
    bookkeeping keys Hugging Face / Lightning (epoch) and results.csv (time) log."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    events, metrics = [], []
    for e in (1, 2):
        events += [
            Event(T0 + (e - 1) * 150, "epoch_start", payload={"epoch": e}),
            Event(T0 + e * 150, "epoch_end", payload={"epoch": e, "images": 1000}),
        ]
        t = T0 + e * 150
        metrics += [
            Metric(t, "loss", 1.0 / e, e),
            Metric(t, "images", 999.5, e),
            Metric(t, "wall_s", 0.25, e),
            Metric(t, "epoch", e - 0.5, e),
            Metric(t, "time", 149.0, e),
        ]
    with Ledger(url) as ledger:
        _run(ledger, n=60, gpus=1, events=events, metrics=metrics)
    return url


def test_a_metric_named_like_a_fixed_column_does_not_overwrite_it(metrics_url: str, tmp_path: Path) -> None:
    text = _cli(metrics_url, "export", RUN, "--metrics")
    header = text.splitlines()[0].split(",")
    assert len(header) == len(set(header))  # no duplicate column
    assert header[-3:] == ["loss", "metric:images", "metric:wall_s"]
    assert "time" not in header and header.count("epoch") == 1  # not training metrics, as in show
    epoch1 = next(r for r in csv.DictReader(io.StringIO(text)) if r["epoch"] == "1")
    assert (epoch1["images"], epoch1["wall_s"]) == ("1000", "150.0")  # the fixed columns won
    assert (epoch1["metric:images"], epoch1["metric:wall_s"]) == ("999.5", "0.25")
    lines = [
        json.loads(line) for line in _cli(metrics_url, "export", RUN, "--metrics", "--format", "jsonl").splitlines()
    ]
    jl = next(r for r in lines if r["epoch"] == 1)
    assert (jl["images"], jl["metric:images"], jl["wall_s"], jl["metric:wall_s"]) == (1000, 999.5, 150.0, 0.25)
    assert "time" not in jl


def test_metrics_parquet_with_colliding_names_reads_back(metrics_url: str, tmp_path: Path) -> None:
    pq = need_module("pyarrow.parquet", "the parquet extra: pip install 'gpuledger[parquet]'")
    path = tmp_path / "epochs.parquet"
    _cli(metrics_url, "export", RUN, "--metrics", "--format", "parquet", "-o", str(path))
    table = pq.read_table(path)  # ArrowInvalid "multiple matches" when two columns shared a name
    epoch1 = next(r for r in table.to_pylist() if r["epoch"] == 1)
    assert (epoch1["images"], epoch1["metric:images"], epoch1["wall_s"]) == (1000, 999.5, 150.0)


def test_a_prefixed_name_that_is_taken_too_gets_another_prefix() -> None:
    from gpuledger.reports.run.epochs import metric_column_names

    names = metric_column_names(["images", "metric:images", "loss"])
    assert names == {"images": "metric:metric:images", "metric:images": "metric:images", "loss": "loss"}
