"""Helpers for the Prometheus tests: free ports, the Debian binaries, a real Prometheus server."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
ALERTS = DEPLOY / "prometheus" / "gpuledger-alerts.yml"
ALERT_TESTS = DEPLOY / "prometheus" / "gpuledger-alerts.test.yml"
DASHBOARD = DEPLOY / "grafana" / "gpuledger-dashboard.json"
APT_HINT = "apt-get install -y --no-install-recommends prometheus"


def need_binary(name: str) -> str:
    """The Debian binary (/usr/bin/NAME); skipped when absent outside CI, a failure in CI."""
    path = f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else shutil.which(name)
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{name} is missing in CI: {APT_HINT}")
    pytest.skip(f"{name} is not installed ({APT_HINT}) and CI is not set")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


class Prometheus:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def api(self, path: str, **params: str) -> dict:
        url = f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        data = json.loads(http_get(url))
        assert data["status"] == "success", data
        return data["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def query_range(self, expr: str, seconds: float, step: float = 1.0) -> list[dict]:
        end = time.time()
        return self.api("query_range", query=expr, start=str(end - seconds), end=str(end), step=str(step))["result"]


@contextmanager
def prometheus_server(
    tmp_path: Path,
    targets: list[str],
    *,
    rule_files: list[Path] = (),
    metrics_path: str = "/metrics",
    bearer: str | None = None,
) -> Iterator[Prometheus]:
    """A real Prometheus on 127.0.0.1 (free port, tmp storage) scraping ``targets`` every second."""
    binary = need_binary("prometheus")
    port = free_port()
    job = {"job_name": "gpuledger", "metrics_path": metrics_path, "static_configs": [{"targets": targets}]}
    if bearer:
        job["authorization"] = {"type": "Bearer", "credentials": bearer}
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [job],
    }
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(json.dumps(config))  # JSON is YAML
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    prom = Prometheus(port)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                http_get(f"{prom.base}/-/ready", timeout=1)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "Prometheus did not start:\n" + (tmp_path / "prometheus.log").read_text()
                    ) from None
                time.sleep(0.2)
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


CONSTANT_TRACE = [
    {
        "format": "gpuledger-gpu-trace",
        "version": 1,
        "gpus": [
            {"uuid": "GPU-00000000-0000-4000-8000-000000000001", "name": "NVIDIA A100-SXM4-80GB"},
            {"uuid": "GPU-00000000-0000-4000-8000-000000000002", "name": "NVIDIA A100-SXM4-80GB"},
        ],
    },
    {"t": 0, "gpu": 0, "util_pct": 50, "mem_used_b": 20 * 2**30, "power_w": 250.0, "temp_c": 60, "throttle": ["power"]},
    {"t": 0, "gpu": 1, "util_pct": 80, "mem_used_b": 40 * 2**30, "power_w": 300.0, "temp_c": 65},
]


def write_constant_trace(path: Path) -> Path:
    """Two A100s at a constant 50 % and 80 % utilisation, 250 W and 300 W (GPU 0 power-throttled)."""
    path.write_text("".join(json.dumps(line) + "\n" for line in CONSTANT_TRACE))
    return path
