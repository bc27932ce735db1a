"""A real Prometheus (Debian's) scrapes a running `gpuledger run --metrics-port` and PromQL agrees.

The run replays two GPUs at a constant 50 % and 80 % utilisation, so the busy-seconds counter must
grow at 0.5 and 0.8 per second: ``rate(gpuledger_gpu_busy_seconds_total[10s])`` says so. The alert
rules are loaded into the same server, and every expression of the Grafana dashboard is evaluated
against it (no PromQL error). Skipped only when /usr/bin/prometheus is absent and CI is unset.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e_helpers import GPULEDGER, cli_env
from prom_support import ALERTS, DASHBOARD, free_port, http_get, need_binary, prometheus_server, write_constant_trace

pytestmark = pytest.mark.slow
RUN_S = 28


def _wait_for(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _grafana_expr(expr: str) -> str:
    return (
        expr.replace("$__rate_interval", "10s")
        .replace("$__range", "1m")
        .replace('"$project"', '".*"')
        .replace('"$team"', '".*"')
        .replace('"$user"', '".*"')
        .replace('"$run_id"', '".*"')
    )


def test_prometheus_rate_of_busy_seconds_is_the_replayed_utilisation(tmp_path: Path) -> None:
    need_binary("prometheus")
    trace = write_constant_trace(tmp_path / "constant.jsonl")
    port = free_port()
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db")
    with prometheus_server(tmp_path, [f"127.0.0.1:{port}"], rule_files=[ALERTS]) as prom:
        run = subprocess.Popen(
            [
                *GPULEDGER,
                "run",
                "--metrics-port",
                str(port),
                "--interval",
                "1",
                "--project",
                "vision",
                "--team",
                "cv",
                "--replay-gpus",
                str(trace),
                "--",
                sys.executable,
                "-c",
                f"import time; time.sleep({RUN_S})",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            body = _wait_for(lambda: _scrape(port), 20, "the exporter")
            assert "gpuledger_gpu_busy_seconds_total" in body
            _wait_for(lambda: prom.query('up{job="gpuledger"} == 1'), 20, "Prometheus to scrape the run")
            time.sleep(18)  # rate() over [10s] is exact once 10 s of samples exist; then 5 s more to read
            rates = prom.query_range("rate(gpuledger_gpu_busy_seconds_total[10s])", seconds=5)
            by_gpu = {r["metric"]["gpu"]: statistics.median(float(v) for _, v in r["values"]) for r in rates}
            assert by_gpu.keys() == {"0", "1"}, rates
            assert by_gpu["0"] == pytest.approx(0.5, abs=0.05), rates
            assert by_gpu["1"] == pytest.approx(0.8, abs=0.05), rates
            power = prom.query("rate(gpuledger_gpu_energy_joules_total[10s])")
            assert {r["metric"]["gpu"]: round(float(r["value"][1])) for r in power} == pytest.approx(
                {"0": 250, "1": 300}, abs=15
            )
            info = prom.query("gpuledger_run_info")
            assert len(info) == 1
            labels = info[0]["metric"]
            assert (labels["project"], labels["team"], labels["status"]) == ("vision", "cv", "running")
            assert labels["instance"] == f"127.0.0.1:{port}" and "host" not in labels
            throttled = prom.query('rate(gpuledger_gpu_throttle_seconds_total{reason="power"}[10s]) > 0.5')
            assert [r["metric"]["gpu"] for r in throttled] == ["0"]
            rules = prom.api("rules")["groups"][0]["rules"]
            assert {r["name"] for r in rules} == {
                "GpuledgerGpuUnderused",
                "GpuledgerGpuMemoryNearlyFull",
                "GpuledgerRunsFailingFast",
            }
            assert all(r["health"] == "ok" for r in rules), rules
            for panel_expr in _dashboard_exprs():
                prom.query(_grafana_expr(panel_expr))  # raises on a PromQL error
        finally:
            _out, err = run.communicate(timeout=RUN_S + 30)
    assert run.returncode == 0, err.decode()


def _scrape(port: int) -> str | None:
    try:
        body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=2).decode()
    except OSError:
        return None
    return body if "gpuledger_gpu_busy_seconds_total{" in body else None


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
