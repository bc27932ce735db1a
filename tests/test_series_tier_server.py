"""The team server's interval pages and export, and ``cost RUN``, of a run whose raw days were
tiered into a series store and dropped from PostgreSQL (store/series_tier.py): with the store
(``serve --series``, ``GPULEDGER_SERIES``) they give the rows and per-GPU lines they gave before
the drop, to the store's units (series/quantum.py); without it, the rows are gone and ``cost``
prices the run from its rollups, one line per GPU model, the same total. Other runs keep the SQL
path. On the real PostgreSQL server, into the compact PostgreSQL store and ClickHouse on chDB.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

import test_series_tier as tiers
from gpuledger.cli.main import cli
from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, accounts
from server_support import bearer, devices_doc, gpu_rows, host_rows, run_doc
from test_pg_partitions import OPEN_DAYS
from test_series_tier_reads import _drop, _quantized

pytestmark = pytest.mark.postgres

pg_url, series_url = tiers.pg_url, tiers.series_url
N = tiers.N
PAGE = 25  # rows per series per page: the run's 2 x 60 GPU rows and 60 host rows take several


def _token(pg_url: str) -> str:
    with Ledger(pg_url) as led:
        return accounts.issue_token(led, "reader", role="admin", actor="test", create_user=True)[1]


def _client(pg_url: str, series: str | None) -> TestClient:
    return TestClient(create_app(pg_url, settings=Settings(close_after_days=OPEN_DAYS, lost_after_s=0, series=series)))


def _key(row: dict[str, Any]) -> tuple[str, str, int]:
    return (row["series"], row["gpu_uuid"] or "", row["seq"])


def _paged(client: TestClient, token: str, run_id: str) -> dict[str, Any]:
    """Every row of the run through /intervals pages of PAGE rows, as docs/SERVER.md says to page
    (after_t just below the last row's t1, an overlap dropped by key); and the first page as it is."""
    rows: dict[str, dict[tuple[str, str, int], dict[str, Any]]] = {"gpu": {}, "host": {}}
    first: dict[str, Any] | None = None
    for name in rows:
        after: float | None = None
        while True:
            params: dict[str, Any] = {"limit": PAGE} | ({} if after is None else {"after_t": after})
            got = client.get(f"/api/v1/runs/{run_id}/intervals", params=params, headers=bearer(token))
            assert got.status_code == 200, got.text
            page = got.json()
            first = first or page
            found = page[name]
            assert [r["t0"] for r in found] == sorted(r["t0"] for r in found)  # oldest first
            new = [r for r in found if _key(r) not in rows[name]]
            rows[name].update((_key(r), r) for r in found)
            if len(found) < PAGE or not new:
                break
            after = found[-1]["t1"] - 1e-3
    assert first is not None
    export = client.get(f"/api/v1/runs/{run_id}/export", params={"format": "jsonl"}, headers=bearer(token))
    assert export.status_code == 200, export.text
    return {
        "first": first,
        "gpu": sorted(rows["gpu"].values(), key=_key),
        "host": sorted(rows["host"].values(), key=_key),
        "export": [json.loads(line) for line in export.text.splitlines()],
    }


def _q(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [_quantized(r) for r in rows]


def _other_run() -> dict[str, Any]:
    """A run of today: never dropped, read in SQL whatever the server's store."""
    start = tiers.NOW - 3600
    return {
        "run": run_doc(started_at=start, status="succeeded", ended_at=start + 50.0, exit_code=0),
        "devices": devices_doc(1),
        "gpu_intervals": gpu_rows(10, devices=1, start=start),
        "host_intervals": host_rows(10, start=start),
        "final": True,
    }


def test_interval_pages_and_export_of_a_tiered_run_give_the_rows_of_before_the_drop(
    pg_url: str, series_url: str
) -> None:
    other = _other_run()
    run_id, _, _ = tiers._ingested(pg_url, 2, other)
    other_id = other["run"]["id"]
    token = _token(pg_url)
    with _client(pg_url, None) as client:
        before = _paged(client, token, run_id)
        other_before = _paged(client, token, other_id)
    assert len(before["gpu"]) == 2 * N and len(before["host"]) == N and len(before["export"]) == 3 * N
    assert len(before["first"]["gpu"]) == len(before["first"]["host"]) == PAGE
    _drop(pg_url, series_url)
    with _client(pg_url, series_url) as client:
        after = _paged(client, token, run_id)
        other_after = _paged(client, token, other_id)
    with _client(pg_url, None) as client:
        gone = _paged(client, token, run_id)
    for part in ("gpu", "host", "export"):
        assert _q(after[part]) == _q(before[part]), part
    # The same first page: the same rows, in the same order, cut at the same place.
    for name in ("gpu", "host"):
        assert _q(after["first"][name]) == _q(before["first"][name]), name
    assert after["gpu"] != before["gpu"]  # the values were finer than the store's units
    assert other_after == other_before  # a run with no tiered day: the SQL rows, exactly
    assert gone["gpu"] == gone["host"] == gone["export"] == []  # without the store: gone, as before


def _cost(pg_url: str, tmp_path: Path, run_id: str, series: str | None) -> dict[str, Any]:
    env = {"GPULEDGER_RATES": "", "GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_SERIES": series or ""}
    out = CliRunner().invoke(cli, ["cost", run_id, "--db", pg_url, "--json"], env=env)
    assert out.exit_code == 0, out.output
    return json.loads(out.output)["runs"][0]


def _money(line: dict[str, Any]) -> tuple[Decimal, ...]:
    """The line's money to the cent (the store's units move busy time by up to 1 ms an interval)."""
    return tuple(Decimal(line[k]).quantize(Decimal("0.01")) for k in sorted(line) if k.endswith("cost"))


def test_cost_of_a_tiered_run_keeps_its_per_gpu_lines_with_the_store(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    run_id, _, _ = tiers._ingested(pg_url)
    before = _cost(pg_url, tmp_path, run_id, None)
    _drop(pg_url, series_url)
    after = _cost(pg_url, tmp_path, run_id, series_url)
    rollups = _cost(pg_url, tmp_path, run_id, None)
    assert [g["gpu_uuid"] for g in before["gpus"]] == ["GPU-0", "GPU-1"]
    # With the store: one line per GPU, as before the drop, the same money to the cent.
    assert [g["gpu_uuid"] for g in after["gpus"]] == [g["gpu_uuid"] for g in before["gpus"]]
    assert [_money(g) for g in after["gpus"]] == [_money(g) for g in before["gpus"]]
    assert [g["allocated_gpu_h"] for g in after["gpus"]] == [g["allocated_gpu_h"] for g in before["gpus"]]
    assert all(g["busy_gpu_h"] > 0 for g in after["gpus"])
    assert _money(after["total"]) == _money(before["total"])
    # Without it: priced from the run's rollups, one line per GPU model, the same total.
    assert len(rollups["gpus"]) == 1 and rollups["gpus"][0]["gpu_uuid"] is None
    assert _money(rollups["total"]) == _money(before["total"])
    # Once the store dropped the tiered days past its own window, its reads miss them: the rollups.
    # the run's days are 10 and 11 days old
    assert tiers.expire_store_days(pg_url, series_url, series_days=5, now=tiers.NOW) == 2
    expired = _cost(pg_url, tmp_path, run_id, series_url)
    assert expired["gpus"] == rollups["gpus"] and _money(expired["total"]) == _money(before["total"])


def test_cost_of_a_tiered_run_that_shared_a_gpu_is_priced_from_its_rollups(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    """Another run held GPU-0 at the same time: the split needs both runs' rows, gone with the day,
    so the rollups (split while the rows were there) price it, the same total as before."""
    start = (tiers.TODAY - 10) * tiers.DAY_S - N / 2 * 5.0
    neighbour = {
        "run": run_doc(started_at=start, status="succeeded", ended_at=start + N * 5.0, exit_code=0),
        "devices": devices_doc(1),
        "gpu_intervals": gpu_rows(N, devices=1, start=start),
        "host_intervals": host_rows(N, start=start),
        "final": True,
    }
    run_id, _, _ = tiers._ingested(pg_url, 2, neighbour)
    before = _cost(pg_url, tmp_path, run_id, None)
    assert [g["gpu_uuid"] for g in before["gpus"]] == ["GPU-0", "GPU-1"]
    _drop(pg_url, series_url)
    after = _cost(pg_url, tmp_path, run_id, series_url)
    assert len(after["gpus"]) == 1 and after["gpus"][0]["gpu_uuid"] is None
    assert _money(after["total"]) == _money(before["total"])
