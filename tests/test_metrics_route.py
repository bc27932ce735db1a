"""The team server's ``GET /metrics``: token required, runs limited to the caller's projects."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gpuledger.core.model import GpuIdentity, GpuInterval, HostInterval, RunRecord
from gpuledger.server.app import create_app
from gpuledger.store import Ledger, accounts

GIB = 2**30


def _seed(ledger: Ledger, now: float) -> dict[str, str]:
    ids = {}
    for n, (project, status, ended) in enumerate(
        [
            ("vision", "running", None),
            ("nlp", "running", None),
            ("vision", "failed", now - 60),
            ("vision", "succeeded", now - 86400),
        ]
    ):
        run = RunRecord(
            id=f"01900000-0000-7000-8000-00000000000{n}",
            command=["train"],
            user=f"u{n}",
            host="node",
            cwd="/",
            started_at=now - 3600 * (n + 1),
            status=status,
            ended_at=ended,
            labels={"project": project, "team": "t"},
        )
        ledger.create_run(run)
        ledger.add_devices(run.id, [GpuIdentity(index=0, uuid=f"GPU-{n}", name="NVIDIA H100", memory_total_b=80 * GIB)])
        ledger.append(
            run.id,
            [
                GpuInterval(
                    f"GPU-{n}",
                    0,
                    now - 10,
                    now - 5,
                    busy_s=2.0,
                    energy_j=1000.0,
                    mem_used_last_b=GIB,
                    throttle_s={"thermal": 0.5},
                )
            ],
            [HostInterval(0, now - 10, now - 5, cpu_s=3.0)],
            [],
            [],
        )
        ids[f"{project}-{status}"] = run.id
    return ids


@pytest.fixture
def server(ledger_url: str):
    now = time.time()
    with Ledger(ledger_url) as ledger:
        ids = _seed(ledger, now)
        accounts.add_project(ledger, "vision", actor="test")
        accounts.add_project(ledger, "nlp", actor="test")
        _, admin = accounts.issue_token(ledger, "root", role="admin", actor="test", create_user=True)
        _, member = accounts.issue_token(
            ledger, "ann", role="member", actor="test", create_user=True, projects=["vision"]
        )
        accounts.add_member(ledger, "ann", "vision", actor="test")
        _, agent = accounts.issue_token(
            ledger, "node-1", role="agent", actor="test", create_user=True, projects=["vision"]
        )
    app = create_app(ledger_url)
    with TestClient(app) as client:
        yield client, ids, {"admin": admin, "member": member, "agent": agent}


def _runs(client: TestClient, token: str) -> dict[str, dict[str, float]]:
    resp = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain")
    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(resp.text):
        for s in fam.samples:
            out.setdefault(s.labels["run_id"], {})[s.name] = s.value
    return out


def test_metrics_need_a_token(server) -> None:
    client, _, _ = server
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer glt_000000000000_nope"}).status_code == 401


def test_admin_sees_running_and_recently_ended_runs_with_their_sums(server) -> None:
    client, ids, tokens = server
    runs = _runs(client, tokens["admin"])
    assert set(runs) == {ids["vision-running"], ids["nlp-running"], ids["vision-failed"]}  # not the day-old one
    one = runs[ids["vision-running"]]
    assert one["gpuledger_gpu_busy_seconds_total"] == 2.0
    assert one["gpuledger_gpu_energy_joules_total"] == 1000.0
    assert one["gpuledger_gpu_throttle_seconds_total"] == 0.5
    assert one["gpuledger_run_cpu_seconds_total"] == 3.0
    assert one["gpuledger_gpu_memory_used_bytes"] == GIB
    assert one["gpuledger_gpu_memory_total_bytes"] == 80 * GIB
    assert "gpuledger_run_end_time_seconds" in runs[ids["vision-failed"]]


def test_a_member_sees_only_their_projects_and_an_agent_nothing(server) -> None:
    client, ids, tokens = server
    assert set(_runs(client, tokens["member"])) == {ids["vision-running"], ids["vision-failed"]}
    assert _runs(client, tokens["agent"]) == {}


def test_openmetrics_is_offered_to_scrapers_that_ask(server) -> None:
    client, _, tokens = server
    resp = client.get(
        "/metrics",
        headers={"Authorization": f"Bearer {tokens['admin']}", "Accept": "application/openmetrics-text; version=1.0.0"},
    )
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("application/openmetrics-text")
    assert resp.text.rstrip().endswith("# EOF")
    assert "gpuledger_gpu_busy_seconds_total{" in resp.text
