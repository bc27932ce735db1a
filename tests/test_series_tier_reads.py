"""Every read of one run's raw intervals sees the days tiered into the ledger's series store
(store/series_tier.py) once PostgreSQL dropped them: ``report run``, ``export`` (CSV and JSON
Lines), ``show --json`` and the SQL bucketing of big runs (store/series_queries.py) give the
figures they gave before the drop, to the store's units (series/quantum.py). Without the store
they show the rows gone, as before. On the real PostgreSQL server, into the compact PostgreSQL
store and ClickHouse on chDB (the fixtures of test_series_tier.py).
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import test_series_tier as tiers
from gpuledger.cli.main import cli
from gpuledger.core.metering import series
from gpuledger.reports.run import data as run_data
from gpuledger.reports.run.export import COLUMNS
from gpuledger.runs.attempts import attempt_chain
from gpuledger.series import quantum
from gpuledger.store import Ledger, series_queries, series_tier, series_verify, tiered_totals
from gpuledger.store.retention import DAY_S, Policy, run_retention

pytestmark = pytest.mark.postgres

# The fixtures and the run of test_series_tier.py: PostgreSQL, and each series store to tier into.
pg_url, series_url = tiers.pg_url, tiers.series_url
N, _ingested, _retention = tiers.N, tiers._ingested, tiers._retention

NUMERIC = {c.name for c in COLUMNS if c.kind != "str"}
# Quantizing moves a figure by at most half a unit (1/1000 of a second or joule) per interval summed.
SLACK = 2 * N * 0.0005


def _cli(pg_url: str, tmp_path: Path, args: list[str], series_url: str | None) -> str:
    env = {"GPULEDGER_RATES": "", "GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_SERIES": series_url or ""}
    out = CliRunner().invoke(cli, [*args, "--db", pg_url], env=env)
    assert out.exit_code == 0, out.output
    return out.output


def _reads(pg_url: str, run_id: str, tmp_path: Path, series_url: str | None = None) -> dict[str, Any]:
    """What a user reads of the run: report run and show as JSON, export as CSV, JSON Lines and
    Parquet (where pyarrow is installed)."""
    csv_text = _cli(pg_url, tmp_path, ["export", run_id, "--format", "csv"], series_url)
    jsonl = _cli(pg_url, tmp_path, ["export", run_id, "--format", "jsonl"], series_url)
    report = json.loads(_cli(pg_url, tmp_path, ["report", "run", run_id, "--format", "json"], series_url))
    report.pop("generated_at")
    out = {
        "report": report,
        "show": json.loads(_cli(pg_url, tmp_path, ["show", run_id, "--json"], series_url)),
        "csv": [_typed(r) for r in csv.DictReader(io.StringIO(csv_text))],
        "jsonl": [json.loads(line) for line in jsonl.splitlines()],
        "parquet": [],
        "runs": [r for r in json.loads(_cli(pg_url, tmp_path, ["runs", "--json"], series_url)) if r["id"] == run_id],
    }
    if importlib.util.find_spec("pyarrow") is not None:
        import pyarrow.parquet as pq

        path = tmp_path / f"export-{len(list(tmp_path.glob('export-*')))}.parquet"
        _cli(pg_url, tmp_path, ["export", run_id, "--format", "parquet", "-o", str(path)], series_url)
        out["parquet"] = pq.read_table(path).to_pylist()
    return out


def _typed(row: dict[str, str]) -> dict[str, Any]:
    return {k: (None if v == "" else float(v) if k in NUMERIC else v) for k, v in row.items()}


def _quantized(row: dict[str, Any]) -> dict[str, Any]:
    """An export row as the store's units have it."""
    out = dict(row)
    if out.get("throttle_s") is not None:
        out["throttle_s"] = json.loads(out["throttle_s"])
    out = quantum.quantize_gpu(out) if out["series"] == "gpu" else quantum.quantize_host(out)
    for k in ("samples", *(c for c in NUMERIC if c.endswith("_b"))):
        out[k] = None if out.get(k) is None else float(out[k])  # CSV and JSON spell 3 and 3.0 alike
    return out


def _export(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [_quantized(r) for r in rows]


def _close(before: Any, after: Any, where: str = "") -> None:
    """Equal, numbers within the quantizing slack."""
    if isinstance(before, dict) and isinstance(after, dict):
        assert before.keys() == after.keys(), where
        for k in before:
            _close(before[k], after[k], f"{where}.{k}")
    elif isinstance(before, list) and isinstance(after, list):
        assert len(before) == len(after), where
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            _close(b, a, f"{where}[{i}]")
    elif isinstance(before, float | int) and isinstance(after, float | int) and not isinstance(before, bool):
        assert math.isclose(before, after, rel_tol=1e-9, abs_tol=SLACK), (where, before, after)
    else:
        assert before == after, (where, before, after)


def _drop(pg_url: str, series_url: str) -> None:
    tier = series_tier.Tier.open(series_url)
    try:
        with Ledger(pg_url) as led:
            report = _retention(led, tier)
            assert report.days is not None and len(report.days.dropped) == 2, report.days
    finally:
        tier.store.close()


def _half_dropped(pg_url: str, series_url: str, tmp_path: Path) -> None:
    """Both days tiered (``db migrate --series``), then only the first dropped: the second day's
    rows are in the ledger and the store both."""
    env = {"GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_CLOSE_AFTER_DAYS": str(tiers.OPEN_DAYS)}
    migrated = CliRunner().invoke(cli, ["db", "migrate", "--db", pg_url, "--series", series_url], env=env)
    assert migrated.exit_code == 0 and "copied and checked 2 days" in migrated.stdout, migrated.output
    cut = (tiers.TODAY - 10) * DAY_S + 3600.0  # after the run's end, before its second day ends
    tier = series_tier.Tier.open(series_url)
    try:
        with Ledger(pg_url) as led:
            policy = Policy(raw_days=(tiers.NOW - cut) / DAY_S, drop_partitions=True)
            report = run_retention(led, policy, actor="test", now=tiers.NOW, tier=tier)
            assert report.days is not None and len(report.days.dropped) == 1, report.days
    finally:
        tier.store.close()


def test_report_export_and_show_of_a_tiered_run_give_the_figures_they_gave_before_the_drop(
    pg_url: str,
    series_url: str,
    tmp_path: Path,
) -> None:
    run_id, _, _ = _ingested(pg_url)
    before = _reads(pg_url, run_id, tmp_path)
    _drop(pg_url, series_url)
    after = _reads(pg_url, run_id, tmp_path, series_url)
    gone = _reads(pg_url, run_id, tmp_path)
    assert len(before["csv"]) == len(before["jsonl"]) == 3 * N  # 2 GPUs and the host
    assert len(before["parquet"]) in (0, 3 * N)  # 0: no pyarrow here
    # export: the same rows, to the store's units
    assert _export(after["csv"]) == _export(before["csv"])
    assert _export(after["jsonl"]) == _export(before["jsonl"])
    assert _export(after["parquet"]) == _export(before["parquet"])
    assert after["csv"] != before["csv"]  # the values were finer than the store's units
    # report run and show: the same figures and interval counts
    _close(before["report"], after["report"], "report")
    _close(before["show"], after["show"], "show")
    _close(before["runs"], after["runs"], "runs")  # from the audit trail's sums, not the store
    assert after["runs"][0]["gpus"] == 2 and after["runs"][0]["busy_gpu_hours"] > 0
    assert [g["intervals"] for g in after["report"]["gpus"]] == [N, N]
    assert after["show"]["intervals"] == N and after["show"]["busy_gpu_hours"] > 0
    # Without the store the rows are gone, as before this read knew of tiers.
    assert gone["csv"] == gone["jsonl"] == gone["parquet"] == []
    assert [g["intervals"] for g in gone["show"]["gpus"]] == [0, 0] and gone["show"]["busy_gpu_hours"] is None
    assert [(g["intervals"], g["busy"]) for g in gone["report"]["gpus"]] == [(0, "n/a"), (0, "n/a")]
    assert (gone["runs"][0]["gpus"], gone["runs"][0]["busy_gpu_hours"]) == (0, None)


GPU_FIGURES = ("busy_s", "energy_j", "util_max_pct", "power_max_w", "mem_used_max_b", "temp_max_c")
HOST_FIGURES = ("cpu_s", "read_b", "write_b", "rss_max_b")


def _buckets(led: Ledger, run_id: str) -> dict[str, Any]:
    """A big run's report reads (store/series_queries.py): counts, and 10 buckets per stream."""
    counts = series_queries.stream_counts(led, run_id)
    plan = series.plan(counts["t0"], counts["t1"], max([counts["host"], *counts["gpu"].values()]), max_points=10)
    assert plan.width_s is not None  # downsampled: the SQL path for PostgreSQL rows
    gpu = series_queries.bucketed_gpu(led, run_id, plan)
    host = series_queries.bucketed_host(led, run_id, plan)
    return {
        "counts": counts,
        "gpu": {
            uuid: [(b.key, b.n, b.covered_s, *(getattr(b.merged, f) for f in GPU_FIGURES)) for b in found]
            for uuid, found in gpu.items()
        },
        "host": [(b.key, b.n, b.covered_s, *(getattr(b.merged, f) for f in HOST_FIGURES)) for b in host],
    }


class _Reads:
    """The real store, its reads of raw rows noted."""

    def __init__(self, store: Any) -> None:
        self.store, self.calls = store, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def gpu_intervals(self, *args: Any) -> Any:
        self.calls.append("gpu_intervals")
        return self.store.gpu_intervals(*args)

    def host_intervals(self, *args: Any) -> Any:
        self.calls.append("host_intervals")
        return self.store.host_intervals(*args)


def _big_report(led: Ledger, run_id: str) -> dict[str, Any]:
    """The run report's summary of a run read as a big one (downsampled to 10 points per stream)."""
    loaded = run_data.load(led, led.get_run(run_id), now=0.0, max_points=10)
    assert loaded.downsampled
    return loaded.summary


def test_a_big_tiered_runs_buckets_and_counts_are_those_sql_gave_before_the_drop(
    pg_url: str,
    series_url: str,
) -> None:
    run_id, _, _ = _ingested(pg_url)
    with Ledger(pg_url) as led:
        before, report = _buckets(led, run_id), _big_report(led, run_id)
        facts = run_data.facts_of(led, led.get_run(run_id), cost=False)  # a later run's history line
        chain = attempt_chain(led, run_id)["attempts"]  # show's attempts line
    _drop(pg_url, series_url)
    store = _Reads(series_tier.open_store(series_url, create=False))
    with Ledger(pg_url, series=store) as led:  # type: ignore[arg-type]
        assert led.tiered(run_id)
        after = _buckets(led, run_id)
        store.calls.clear()
        report_after = _big_report(led, run_id)
        assert store.calls == ["gpu_intervals", "host_intervals"]  # the report reads the store once
        facts_after = run_data.facts_of(led, led.get_run(run_id), cost=False)
        chain_after = attempt_chain(led, run_id)["attempts"]
    _close(chain, chain_after, "attempts")
    assert chain_after[0]["gpu_busy_seconds"] and chain_after[0]["cpu_seconds"]
    assert facts.busy_gpu_h is not None and facts_after.busy_gpu_h is not None
    assert math.isclose(facts.busy_gpu_h, facts_after.busy_gpu_h, abs_tol=SLACK / 3600)
    assert after["counts"] == before["counts"] and before["counts"]["gpu"] == {"GPU-0": N, "GPU-1": N}
    assert len(before["host"]) >= 5 and sorted(before["gpu"]) == ["GPU-0", "GPU-1"]
    _close([list(b) for b in before["host"]], [list(b) for b in after["host"]], "host")
    _close(
        {u: [list(b) for b in v] for u, v in before["gpu"].items()},
        {u: [list(b) for b in v] for u, v in after["gpu"].items()},
        "gpu",
    )
    _close(report, report_after, "summary")
    with Ledger(pg_url) as led:  # without the store: nothing left to count
        assert not led.tiered(run_id)
        assert series_queries.stream_counts(led, run_id) == {"gpu": {}, "host": 0, "t0": None, "t1": None}


def test_sums_count_each_row_once_when_its_day_is_tiered_twice_or_kept(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    """``db migrate --series`` tiers both days and drops none; retention then tiers and drops the
    first only: one day is recorded twice and one is tiered but still held."""
    run_id, _, _ = _ingested(pg_url)
    with Ledger(pg_url) as led:
        chain = attempt_chain(led, run_id)["attempts"]
    before = _reads(pg_url, run_id, tmp_path)
    _half_dropped(pg_url, series_url, tmp_path)
    with Ledger(pg_url) as led:
        assert 0 < len(led.gpu_intervals(run_id)) < 2 * N
    with Ledger(pg_url, series=series_url) as led:
        assert len(led.gpu_intervals(run_id)) == 2 * N
        _close(chain, attempt_chain(led, run_id)["attempts"], "attempts")
        assert tiered_totals.gpu_sums(led, run_id)["GPU-0"]["count"] == N
        assert tiered_totals.host_sums(led, run_id)["count"] == N
    after = _reads(pg_url, run_id, tmp_path, series_url)
    for read in ("report", "show", "runs"):
        _close(before[read], after[read], read)
    assert _export(after["csv"]) == _export(before["csv"])


def test_days_the_store_dropped_past_its_window_are_gone_from_every_read(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    run_id, _, _ = _ingested(pg_url)
    _drop(pg_url, series_url)
    # the run's days are 10 and 11 days old
    assert tiers.expire_store_days(pg_url, series_url, series_days=5, now=tiers.NOW) == 2
    after = _reads(pg_url, run_id, tmp_path, series_url)
    assert after["csv"] == [] and after["show"]["busy_gpu_hours"] is None
    assert (after["runs"][0]["gpus"], after["runs"][0]["busy_gpu_hours"]) == (0, None)
    with Ledger(pg_url, series=series_url) as led:
        assert attempt_chain(led, run_id)["attempts"][0]["gpu_busy_seconds"] is None
        assert attempt_chain(led, run_id)["attempts"][0]["cpu_seconds"] is None


def _unmeasured(run_id: str) -> dict[str, Any]:
    """A second run on the same GPUs and days whose busy time, energy and CPU nothing measured."""
    body = tiers._body((tiers.TODAY - 10) * DAY_S - N / 2 * 5.0)
    body["run"]["id"] = run_id
    for r in body["gpu_intervals"]:
        r.update(busy_s=None, util_method=None, util_max_pct=None, energy_j=None, energy_method=None)
    for r in body["host_intervals"]:
        r["cpu_s"] = None
    return body


def _busy_read(pg_url: str, run_id: str, tmp_path: Path, series_url: str | None) -> dict[str, Any]:
    runs = json.loads(_cli(pg_url, tmp_path, ["runs", "--json"], series_url))
    show = json.loads(_cli(pg_url, tmp_path, ["show", run_id, "--json"], series_url))
    row = next(r for r in runs if r["id"] == run_id)
    with Ledger(pg_url, series=series_url) as led:
        attempt = attempt_chain(led, run_id)["attempts"][0]
    return {
        "runs": (row["gpus"], row["busy_gpu_hours"]),
        "show": show["busy_gpu_hours"],
        "attempt": (attempt["gpu_busy_seconds"], attempt["gpu_energy_joules"], attempt["cpu_seconds"]),
    }


def test_a_tiered_run_whose_busy_time_was_not_measured_reads_n_a_not_zero(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    """``runs``, ``show`` and its attempts of a run nothing measured give None (n/a) after its days
    were tiered and dropped, as the ledger's own rows gave before: unmeasured is never idle."""
    unmeasured = "0b5e55ed-0000-4000-8000-000000000001"
    _ingested(pg_url, 2, _unmeasured(unmeasured))
    before = _busy_read(pg_url, unmeasured, tmp_path, None)
    assert before == {"runs": (2, None), "show": None, "attempt": (None, None, None)}
    _drop(pg_url, series_url)
    with Ledger(pg_url, series=series_url) as led:
        assert led.tiered(unmeasured) and tiered_totals.gpu_sums(led, unmeasured)["GPU-0"]["count"] == N
    assert _busy_read(pg_url, unmeasured, tmp_path, series_url) == before


def test_a_tier_payload_from_before_measured_counts_still_verifies(pg_url: str, series_url: str) -> None:
    """Days tiered before the summary counted measured rows: their entries have no ``measured``;
    ``audit verify --series`` still finds the store equal."""
    run_id, _, _ = _ingested(pg_url)
    _drop(pg_url, series_url)
    store = series_tier.open_store(series_url, create=False)
    try:
        with Ledger(pg_url, series=store) as led:
            payloads = [p for r, p in led.read(lambda c: list(series_verify.tiered(c))) if r == run_id]
            assert payloads and all("measured" in s for p in payloads for s in p["gpu"].values())
            for p in payloads:
                old = {**p, "gpu": {d: _without_measured(s) for d, s in p["gpu"].items()}}
                old["host"] = _without_measured(p["host"])
                assert series_tier.differences(run_id, old, series_tier.stored_summary(store, run_id, old)) == []
    finally:
        store.close()


def _without_measured(part: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if part is None else {k: v for k, v in part.items() if k != "measured"}
