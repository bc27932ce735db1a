"""The value of ended runs on the team server's /metrics (real app, SQLite and PostgreSQL), and the
shipped recording rules computing cost per mAP point from that very exposition in a real Prometheus."""

from __future__ import annotations

import http.server
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gpuledger.core.model import GpuIdentity, GpuInterval, RunRecord
from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, accounts
from prom_support import DEPLOY, prometheus_server
from value_sim import CARD_TEXT, SimRun, write

VALUE_RULES = DEPLOY / "prometheus" / "gpuledger-value-rules.yml"


def _seed(ledger: Ledger, now: float) -> None:
    """Ended 10 min ago: a yolov5m training (2 h, 81 % busy, 10 epochs, mAP 0.40) and the resumed
    attempt of a yolo11n training that crashed two days ago (0.20 -> 0.35); in project nlp an rtdetr
    run. Not valued: a labelled run still recording, an unlabelled one, one that ended two days ago."""
    crashed = SimRun("y11n-a", "yolo11n", now - 2 * 86400, 5, 600.0, 0.85, 2.0, 32, 0.20, status="failed")
    write(
        ledger,
        [
            SimRun("v5m", "yolov5m", now - 600 - 7200, 10, 720.0, 0.81, 2.0, 64, 0.40),
            crashed,
            SimRun(
                "y11n-b",
                "yolo11n",
                now - 300 - 3000,
                5,
                600.0,
                0.85,
                2.0,
                32,
                0.35,
                attempt_of=crashed.id,
                first_epoch=6,
                map_before=0.20,
            ),
            SimRun("rt", "rtdetr", now - 600 - 3600, 2, 1800.0, 0.5, 2.0, 8, 0.30, project="nlp"),
        ],
    )
    for rid, labels, status, ended in (
        ("live", {"project": "detector", "model": "yolov5m"}, "running", None),
        ("plain", {"project": "detector"}, "succeeded", now - 600),
    ):
        ledger.create_run(
            RunRecord(
                id=rid,
                command=["train"],
                user="ana",
                host="h",
                cwd="/",
                started_at=now - 3600,
                status=status,
                ended_at=ended,
                labels=labels,
            )
        )
        ledger.add_devices(rid, [GpuIdentity(0, f"GPU-{rid}", "NVIDIA A100-SXM4-80GB")])
        ledger.append(rid, gpu=[GpuInterval(f"GPU-{rid}", 0, now - 3600, now - 1200, busy_s=2000.0)])


@pytest.fixture
def server(ledger_url: str, tmp_path: Path):
    rates = tmp_path / "rates.toml"
    rates.write_text(f'[card]\ncurrency = "USD"\nbasis = "allocated"\n{CARD_TEXT}')
    with Ledger(ledger_url) as ledger:
        _seed(ledger, time.time())
        for project in ("detector", "nlp"):
            accounts.add_project(ledger, project, actor="test")
        _, admin = accounts.issue_token(ledger, "root", role="admin", actor="test", create_user=True)
        _, member = accounts.issue_token(
            ledger, "ann", role="member", actor="test", create_user=True, projects=["detector"]
        )
        accounts.add_member(ledger, "ann", "detector", actor="test")
    app = create_app(ledger_url, settings=Settings(rates=str(rates)))
    with TestClient(app) as client:
        yield client, {"admin": admin, "member": member}


def _scrape(client: TestClient, token: str) -> tuple[str, dict[str, dict[str, tuple[dict, float]]]]:
    resp = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code == 200, resp.text
    out: dict[str, dict[str, tuple[dict, float]]] = {}
    for fam in text_string_to_metric_families(resp.text):
        for s in fam.samples:
            if "run_id" in s.labels:
                out.setdefault(s.name, {})[s.labels["run_id"]] = (s.labels, s.value)
    return resp.text, out


def test_ended_labelled_runs_carry_their_cost_and_what_it_bought(server) -> None:
    client, tokens = server
    _, got = _scrape(client, tokens["admin"])
    assert set(got["gpuledger_run_cost"]) == {"v5m", "y11n-b", "rt"}
    labels, cost = got["gpuledger_run_cost"]["v5m"]
    assert labels == {
        "run_id": "v5m",
        "project": "detector",
        "team": "vision",
        "user": "ana",
        "model": "yolov5m",
        "model_version": "yolov5m",
        "status": "succeeded",
    }
    assert cost == pytest.approx(2 * 3.43, abs=1e-5)  # 2 h held on the allocated basis
    assert got["gpuledger_run_idle_cost"]["v5m"][1] == pytest.approx(2 * 0.19 * 3.43, abs=1e-5)
    assert got["gpuledger_run_epochs"]["v5m"][1] == 10
    assert got["gpuledger_run_train_images"]["v5m"][1] == 50_000
    assert got["gpuledger_run_map50_95_gain_ratio"]["v5m"][1] == pytest.approx(0.40)
    assert got["gpuledger_run_busy_gpu_seconds"]["v5m"][1] == pytest.approx(0.81 * 7200, abs=0.01)
    assert got["gpuledger_run_measured_gpu_seconds"]["v5m"][1] == pytest.approx(7200, abs=0.01)
    # The resumed attempt gained what it added to the crashed one, which left the scrape long ago.
    assert got["gpuledger_run_map50_95_gain_ratio"]["y11n-b"][1] == pytest.approx(0.15)
    # The value gauges are counted from the ledger once per process: the next scrape prices nothing.
    source = client.app.state.metrics_value_source
    assert source.priced == 3
    _scrape(client, tokens["admin"])
    assert source.priced == 0


def test_a_member_sees_the_value_of_their_projects_only(server) -> None:
    client, tokens = server
    _, got = _scrape(client, tokens["member"])
    assert set(got["gpuledger_run_cost"]) == {"v5m", "y11n-b"}


def test_without_a_readable_rate_card_the_other_metrics_still_flow(
    ledger_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Ledger(ledger_url) as ledger:
        _seed(ledger, time.time())
        _, admin = accounts.issue_token(ledger, "root", role="admin", actor="test", create_user=True)
    app = create_app(ledger_url, settings=Settings(rates=str(tmp_path / "missing.toml")))
    with TestClient(app) as client:
        _, got = _scrape(client, admin)
        _scrape(client, admin)
    assert "live" in got["gpuledger_run_info"] and "gpuledger_run_cost" not in got
    said = [r.getMessage() for r in caplog.records if "no value gauges" in r.getMessage()]
    assert len(said) == 1 and "missing.toml" in said[0]  # said once, not at every scrape


class _Exposition(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.slow
def test_a_real_prometheus_records_cost_per_map_point_from_the_servers_exposition(tmp_path: Path) -> None:
    rates = tmp_path / "rates.toml"
    rates.write_text(f'[card]\ncurrency = "USD"\nbasis = "allocated"\n{CARD_TEXT}')
    url = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger(url) as ledger:
        _seed(ledger, time.time())
        _, admin = accounts.issue_token(ledger, "root", role="admin", actor="test", create_user=True)
    with TestClient(create_app(url, settings=Settings(rates=str(rates)))) as client:
        text, _ = _scrape(client, admin)
    _Exposition.body = text.encode()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Exposition)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    # The shipped rules as they are, evaluated every second instead of every 5 minutes.
    rules = tmp_path / "value-rules.yml"
    rules.write_text(VALUE_RULES.read_text().replace("interval: 5m", "interval: 1s"))
    try:
        with prometheus_server(tmp_path, [f"127.0.0.1:{httpd.server_port}"], rule_files=[rules]) as prom:
            wanted = {
                'model_version:gpuledger_cost_per_map_point:7d{model_version="yolov5m"}': 6.86 / 40,
                'model_version:gpuledger_cost_per_epoch:7d{model_version="yolov5m"}': 0.686,
                'model_version:gpuledger_busy_share:7d{model_version="yolov5m"}': 0.81,
                'model_version:gpuledger_runs:count7d{model_version="yolo11n"}': 1,
                'model_version:gpuledger_cost_per_map_point:7d{model_version="yolo11n"}': 3000
                * 3.43
                / 3600
                / 15,  # 50 min for 15 points
            }
            deadline = time.monotonic() + 60
            got: dict[str, float] = {}
            while time.monotonic() < deadline and set(got) != set(wanted):
                for expr in wanted:
                    result = prom.query(expr)
                    if result:
                        got[expr] = float(result[0]["value"][1])
                time.sleep(0.5)
            for expr, value in wanted.items():
                assert got.get(expr) == pytest.approx(value, rel=1e-5), expr
            rule_groups = prom.api("rules")["groups"]
            assert {r["health"] for g in rule_groups for r in g["rules"]} == {"ok"}
    finally:
        httpd.shutdown()
