"""Exports and interval pages streamed from a server-side cursor: the same bytes as the CLI's
export, pages that add up to the whole run, a limit on streams at once, and memory that does not
grow with the run (checked against a real ``gpuledger serve`` with 200,000 intervals)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from fastapi.testclient import TestClient

from gpuledger.core.model import GpuInterval, HostInterval
from gpuledger.reports.run import export
from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger
from server_support import NOW, ServerProcess, Tokens, batch, bearer, fresh_pg_url, run_doc, setup_accounts


@pytest.fixture
def api(ledger_url: str) -> Iterator[tuple[TestClient, str, Tokens]]:
    """The same API on SQLite and PostgreSQL."""
    tokens = setup_accounts(ledger_url)
    with TestClient(create_app(ledger_url, settings=Settings(max_page=50, stream_rows=7))) as client:
        yield client, ledger_url, tokens


def _pushed_run(client: TestClient, t: Tokens, n: int = 120, devices: int = 2) -> str:
    body = batch(run_doc(), n=n, devices=devices)
    body["gpu_intervals"][3]["throttle_s"] = {"thermal": 1.5, "power": 0.25}
    body["host_intervals"][5]["cpu_s"] = 0.1
    assert client.post("/api/v1/ingest", json=body, headers=bearer(t.agent_a)).status_code == 200
    return body["run"]["id"]


def test_the_export_is_byte_for_byte_the_clis(api) -> None:  # type: ignore[no-untyped-def]
    client, url, t = api
    run_id = _pushed_run(client, t)
    with Ledger(url) as led:
        rows = list(
            export.interval_rows(run_id, led.devices(run_id), led.gpu_intervals(run_id), led.host_intervals(run_id))
        )
    csv = client.get(f"/api/v1/runs/{run_id}/export", params={"format": "csv"}, headers=bearer(t.member_a))
    assert csv.status_code == 200 and csv.headers["content-type"].startswith("text/csv")
    assert csv.text == export.to_csv(rows)
    jsonl = client.get(f"/api/v1/runs/{run_id}/export", params={"format": "jsonl"}, headers=bearer(t.member_a))
    assert jsonl.text == export.to_jsonl(rows) and len(jsonl.text.splitlines()) == 360


def test_interval_pages_add_up_to_the_whole_run(api) -> None:  # type: ignore[no-untyped-def]
    client, _, t = api
    run_id = _pushed_run(client, t)
    whole = client.get(f"/api/v1/runs/{run_id}/export", params={"format": "jsonl"}, headers=bearer(t.member_a))
    expected = {(r["series"], r["gpu_uuid"], r["seq"]) for r in map(json.loads, whole.text.splitlines())}
    seen: set[tuple[str, str | None, int]] = set()
    after = None
    for _ in range(50):  # what the dashboard does: pages of `limit` rows per series, after the last t1
        params = {"limit": 1000} | ({"after_t": after} if after is not None else {})
        page = client.get(f"/api/v1/runs/{run_id}/intervals", params=params, headers=bearer(t.member_a)).json()
        assert set(page) == {"gpu", "host"} and max(len(page["gpu"]), len(page["host"])) <= 50  # max_page
        seen |= {(r["series"], r["gpu_uuid"], r["seq"]) for r in page["gpu"] + page["host"]}
        full = [rows for rows in (page["gpu"], page["host"]) if len(rows) >= 50]
        if not full:
            break
        after = min(rows[-1]["t1"] for rows in full) - 1e-6
    assert seen == expected
    gpu = client.get(f"/api/v1/runs/{run_id}/intervals", params={"limit": 10}, headers=bearer(t.member_a)).json()["gpu"]
    assert [(r["t0"], r["gpu_index"]) for r in gpu] == sorted((r["t0"], r["gpu_index"]) for r in gpu)
    [throttled] = [r for r in gpu if (r["gpu_index"], r["seq"]) == (0, 3)]
    assert json.loads(throttled["throttle_s"]) == {"power": 0.25, "thermal": 1.5}


def test_streams_at_once_are_limited(ledger_url: str) -> None:
    tokens = setup_accounts(ledger_url)
    with TestClient(create_app(ledger_url, settings=Settings(max_streams=1, stream_rows=1))) as client:
        run_id = _pushed_run(client, tokens, n=3000, devices=1)
        path = f"/api/v1/runs/{run_id}/export"
        with client.stream("GET", path, headers=bearer(tokens.member_a)) as first:
            assert first.status_code == 200
            second = client.get(path, headers=bearer(tokens.member_a))
            assert second.status_code == 429 and second.headers["retry-after"] == "1"
            assert sum(len(chunk) for chunk in first.iter_bytes()) > 100_000
        assert client.get(path, headers=bearer(tokens.member_a)).status_code == 200  # the slot is free again


@pytest.mark.slow
def test_a_long_run_costs_no_memory_to_export(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The audit's case: exporting 200,000 intervals took 39.5 MB of body and +400 MB of RSS."""
    with fresh_pg_url() as url:
        tokens = setup_accounts(url)
        run_id = str(uuid.uuid4())
        start = NOW - 30 * 86400
        with Ledger(url) as led:
            # a month ago, pushed now: no month may have closed (store/closed_months.py)
            with TestClient(create_app(url, settings=Settings(close_after_days=62))) as client:
                doc = run_doc(run_id=run_id, started_at=start)
                assert (
                    client.post("/api/v1/ingest", json={"run": doc}, headers=bearer(tokens.agent_a)).status_code == 200
                )
            for first in range(0, 100_000, 20_000):
                seqs = range(first, first + 20_000)
                gpu = [GpuInterval(f"GPU-{d}", i, start + 5 * i, start + 5 * i + 5, 5, busy_s=2.5, energy_j=1000.0,
                                   throttle_s={"power": 0.5}) for d in (0, 1) for i in seqs]  # fmt: skip
                host = [HostInterval(i, start + 5 * i, start + 5 * i + 5, 5, cpu_s=1.0) for i in seqs[:8000]]
                led.append(run_id, gpu, host)
        with ServerProcess(url, log=tmp_path / "server.log") as server:
            assert server.proc is not None
            proc = psutil.Process(server.proc.pid)
            headers = bearer(tokens.member_a)
            with httpx.Client(base_url=server.url, headers=headers, timeout=300) as http:
                http.get("/api/v1/me")  # warm up: imports and the token cache
                before = proc.memory_info().rss
                peak = before
                sizes = {}
                for fmt in ("csv", "jsonl"):
                    size = 0
                    with http.stream("GET", f"/api/v1/runs/{run_id}/export", params={"format": fmt}) as got:
                        assert got.status_code == 200
                        for n, chunk in enumerate(got.iter_bytes()):
                            size += len(chunk)
                            if n % 20 == 0:  # the server's memory while it streams
                                peak = max(peak, proc.memory_info().rss)
                    sizes[fmt] = size
                    peak = max(peak, proc.memory_info().rss)
                page = http.get(f"/api/v1/runs/{run_id}/intervals", params={"limit": 100_000})
                assert len(page.json()["gpu"]) == Settings.max_page  # one page is at most max_page rows
                time.sleep(0.2)
                after = proc.memory_info().rss
    with capsys.disabled():
        print(
            f"\n[export 208,000 intervals] csv {sizes['csv'] / 2**20:.1f} MB, jsonl {sizes['jsonl'] / 2**20:.1f} MB;"
            f" server RSS {before / 2**20:.0f} -> peak {peak / 2**20:.0f} -> {after / 2**20:.0f} MB"
        )
    assert sizes["csv"] > 20 * 2**20
    assert peak - before < 100 * 2**20  # the whole export in memory would be several hundred MB
