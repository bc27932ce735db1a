"""Run lists of series-only runs (``serve --series URL --series-only``, store/series_segments.py):
the server's ``/runs``, ``gpuledger runs`` and ``/metrics`` count such a run's GPUs, busy time and
energy from its ``series_day_sums`` (the ledger holds no interval row of it) as they count the same
pushes' rows kept in the ledger, and ``/runs/{id}/intervals`` pages the store's rows. Real
``gpuledger serve`` processes on PostgreSQL, into both kinds of store (the compact PostgreSQL
store and ClickHouse on chDB).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

import test_series_only as only_tests
import test_series_tier as tiers
from gpuledger.cli.main import cli
from gpuledger.prom.ledger_source import LedgerSource
from gpuledger.store import Ledger
from gpuledger.store.tiered_totals import _merge
from server_support import ServerProcess, bearer, setup_accounts
from test_series_live import N, _pushes
from test_series_only import _pair, _post, _server

pg_url, series_url, pg_store_url = tiers.pg_url, tiers.series_url, only_tests.pg_store_url

PAGE = 7  # rows per /intervals page: several pages per series, a midnight inside one
SAME = ("id", "short_id")  # what differs between the two runs of a pair


def _rows_by_id(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in rows}


def _alike(plain: dict[str, Any], only: dict[str, Any]) -> None:
    """The rows of the pair agree (busy to float rounding: the day sums split rows at midnight)."""
    assert only["gpus"] == plain["gpus"] == 2
    assert plain["busy_gpu_hours"] > 0
    assert only["busy_gpu_hours"] == pytest.approx(plain["busy_gpu_hours"], rel=1e-9)
    drop = (*SAME, "busy_gpu_hours")
    assert {k: v for k, v in only.items() if k not in drop} == {k: v for k, v in plain.items() if k not in drop}


@pytest.mark.parametrize("plain_server", [False, True], ids=["series-only-server", "plain-server"])
def test_the_run_list_counts_a_series_only_runs_gpus_and_busy_time_as_the_same_rows_in_the_ledger(
    pg_url: str, series_url: str, tmp_path: Path, plain_server: bool
) -> None:
    """``GET /runs`` of the series-only server, and of a plain server on the same ledger (the day
    sums are the ledger's: no store needed), and ``gpuledger runs`` with and without the store."""
    plain_id, only_id, tokens = _pair(pg_url, series_url, tmp_path)
    with _server(pg_url, None if plain_server else series_url, tmp_path) as server:
        got = httpx.get(server.url + "/api/v1/runs", headers=bearer(tokens.admin), timeout=60)
    assert got.status_code == 200, got.text
    listed = _rows_by_id(got.json())
    _alike(listed[plain_id], listed[only_id])
    env = {"GPULEDGER_RATES": "", "GPULEDGER_HOME": str(tmp_path / "home")}
    if not plain_server:
        env["GPULEDGER_SERIES"] = series_url
    out = CliRunner().invoke(cli, ["runs", "--format", "json", "--db", pg_url], env=env)
    assert out.exit_code == 0, out.output
    cli_rows = _rows_by_id(json.loads(out.output))
    _alike(cli_rows[plain_id], cli_rows[only_id])
    # the server's list and the CLI's agree on each run
    for run_id in (plain_id, only_id):
        assert cli_rows[run_id]["gpus"] == listed[run_id]["gpus"]
        assert cli_rows[run_id]["busy_gpu_hours"] == pytest.approx(listed[run_id]["busy_gpu_hours"], rel=1e-12)


def test_metrics_count_a_series_only_runs_busy_time_and_energy_from_its_day_sums(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    """``/metrics``' source (prom/ledger_source.py) on the ledger: the series-only run's GPU
    counters equal the plain run's; gauges (a last row) the ledger does not hold stay None."""
    plain_id, only_id, _ = _pair(pg_url, series_url, tmp_path)
    with Ledger(pg_url) as led:
        source = LedgerSource(led, recent_s=1e12)  # both runs ended days ago
        for _ in range(2):  # the first scrape sums each run; the second must keep the same figures
            figures = {f.key.run_id: f for f in source.figures()}
            plain, only = figures[plain_id], figures[only_id]
            assert len(only.gpus) == len(plain.gpus) == 2
            for p, o in zip(plain.gpus, only.gpus, strict=True):
                assert p.index == o.index and p.busy_s is not None and p.energy_j is not None
                # the plain run's sums add each row in integer µs / mJ, the day sums' are whole:
                # they differ by at most half a unit per row
                assert o.busy_s == pytest.approx(p.busy_s, abs=N * 0.5e-6 + 1e-6)
                assert o.energy_j == pytest.approx(p.energy_j, abs=N * 0.5e-3 + 1e-3)


def _key(row: dict[str, Any]) -> tuple[int, int]:
    return (-1 if row["gpu_index"] is None else row["gpu_index"], row["seq"])


def _paged(server: ServerProcess, token: str, run_id: str, series: str) -> list[dict[str, Any]]:
    """Every row of ``series`` through /intervals pages of PAGE rows (after_t just below the last
    row's t1, an overlap dropped by key), as docs/SERVER.md says to page."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    after: float | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": PAGE} | ({} if after is None else {"after_t": after})
        got = httpx.get(
            f"{server.url}/api/v1/runs/{run_id}/intervals", params=params, headers=bearer(token), timeout=60
        )
        assert got.status_code == 200, got.text
        found = got.json()[series]
        pages += 1
        assert len(found) <= PAGE
        assert [r["t0"] for r in found] == sorted(r["t0"] for r in found)  # oldest first
        new = [r for r in found if _key(r) not in rows]
        rows.update((_key(r), r) for r in found)
        if len(found) < PAGE or not new:
            break
        after = found[-1]["t1"] - 1e-3
    assert pages > 2
    return [rows[k] for k in sorted(rows)]


def test_intervals_pages_a_series_only_runs_rows_from_the_store(pg_url: str, series_url: str, tmp_path: Path) -> None:
    """The series-only run's /intervals pages hold the plain run's rows (to the store's units)."""
    plain_id, only_id, tokens = _pair(pg_url, series_url, tmp_path)
    with _server(pg_url, series_url, tmp_path) as server:
        for series in ("gpu", "host"):
            plain = _paged(server, tokens.admin, plain_id, series)
            only = _paged(server, tokens.admin, only_id, series)
            assert len(only) == len(plain) > 2 * PAGE
            for p, o in zip(plain, only, strict=True):
                assert (o["seq"], o["gpu_index"], o["run_id"]) == (p["seq"], p["gpu_index"], only_id)
                assert o["t0"] == pytest.approx(p["t0"], abs=1e-3) and o["t1"] == pytest.approx(p["t1"], abs=1e-3)
                if series == "gpu":
                    assert (o["busy_s"] is None) == (p["busy_s"] is None)
                    if p["busy_s"] is not None:
                        assert o["busy_s"] == pytest.approx(p["busy_s"], abs=1e-3)


def test_an_unmeasured_series_only_run_lists_its_gpus_with_busy_time_none_not_zero(
    pg_url: str, pg_store_url: str, tmp_path: Path
) -> None:
    """GPUs whose rows measured no busy time or energy: the run lists its GPUs, busy n/a (None)."""
    tokens = setup_accounts(pg_url)
    whole, _, _ = _pushes()
    for r in whole["gpu_intervals"]:
        r["busy_s"] = r["energy_j"] = None
    with _server(pg_url, pg_store_url, tmp_path) as server:
        assert _post(server, tokens.agent_a, whole).status_code == 200
        got = httpx.get(server.url + "/api/v1/runs", headers=bearer(tokens.admin), timeout=60)
    assert got.status_code == 200, got.text
    row = _rows_by_id(got.json())[whole["run"]["id"]]
    assert (row["gpus"], row["busy_gpu_hours"]) == (2, None)
    out = CliRunner().invoke(cli, ["runs", "--json", "--db", pg_url], env={"GPULEDGER_HOME": str(tmp_path / "h")})
    assert out.exit_code == 0, out.output
    row = _rows_by_id(json.loads(out.output))[whole["run"]["id"]]
    assert (row["gpus"], row["busy_gpu_hours"]) == (2, None)
    with Ledger(pg_url) as led:
        figures = {f.key.run_id: f for f in LedgerSource(led, recent_s=1e12).figures()}
    gpus = figures[whole["run"]["id"]].gpus
    assert len(gpus) == 2 and all(g.busy_s is None and g.energy_j is None for g in gpus)


@given(st.lists(st.one_of(st.none(), st.floats(0, 1e6)), max_size=8), st.one_of(st.none(), st.floats(0, 1e6)))
def test_merged_series_only_sums_add_what_was_measured_and_stay_none_when_nothing_was(
    parts: list[float | None], held: float | None
) -> None:
    """``tiered_totals._merge``: counts add; a sum adds the measured values, None when none is."""
    totals: dict[str, Any] = {"count": 3, "busy_s": held}
    for busy in parts:
        _merge(totals, {"count": 2, "busy_s": busy, "energy_j": None})
    present = [v for v in (held, *parts) if v is not None]
    assert totals["count"] == 3 + 2 * len(parts)
    assert totals.get("energy_j") is None
    if present:
        assert totals["busy_s"] == pytest.approx(sum(present))
    else:
        assert totals["busy_s"] is None
