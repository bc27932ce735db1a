"""The shipped Prometheus alert rules (promtool) and Grafana dashboard only use metrics we export."""

from __future__ import annotations

import json
import re
import subprocess

import yaml

from gpuledger.prom.names import EXPOSED_NAMES
from prom_support import ALERT_TESTS, ALERTS, DASHBOARD, REPO, need_binary

METRIC = re.compile(r"\bgpuledger_[a-z_]+")


def test_alert_rules_pass_promtool_check_and_unit_tests() -> None:
    promtool = need_binary("promtool")
    check = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = subprocess.run([promtool, "test", "rules", ALERT_TESTS.name], cwd=ALERT_TESTS.parent,
                           capture_output=True, text=True, timeout=120)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "SUCCESS" in tests.stdout


def test_alert_rules_cover_the_three_conditions_with_our_metrics() -> None:
    rules = {r["alert"]: r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}
    assert set(rules) == {"GpuledgerGpuUnderused", "GpuledgerGpuMemoryNearlyFull", "GpuledgerRunsFailingFast"}
    assert "0.20" in rules["GpuledgerGpuUnderused"]["expr"] and rules["GpuledgerGpuUnderused"]["for"] == "15m"
    for rule in rules.values():
        assert set(METRIC.findall(rule["expr"])) <= EXPOSED_NAMES, rule["expr"]
    tested = {t["alertname"] for case in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
              for t in case["alert_rule_test"]}
    assert tested == set(rules)


def _exprs(dashboard: dict) -> list[str]:
    out = []
    for panel in dashboard["panels"]:
        out += [t["expr"] for t in panel.get("targets", [])]
    out += [v["definition"] for v in dashboard["templating"]["list"]]
    return out


def test_grafana_dashboard_is_valid_json_using_only_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = _exprs(dashboard)
    assert len(exprs) >= 10
    used = {m for e in exprs for m in METRIC.findall(e)}
    assert used <= EXPOSED_NAMES, used - EXPOSED_NAMES
    assert {"gpuledger_gpu_busy_seconds_total", "gpuledger_gpu_power_watts", "gpuledger_gpu_memory_used_bytes",
            "gpuledger_gpu_temperature_celsius", "gpuledger_run_cpu_seconds_total", "gpuledger_run_info"} <= used
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] and dashboard["__inputs"][0]["pluginId"] == "prometheus"


def test_prometheus_doc_lists_every_exported_name_and_the_shipped_files() -> None:
    doc = (REPO / "docs" / "PROMETHEUS.md").read_text()
    for name in EXPOSED_NAMES:
        assert f"`{name}`" in doc, name
    for path in ("deploy/prometheus/gpuledger-alerts.yml", "deploy/grafana/gpuledger-dashboard.json",
                 "--metrics-port"):
        assert path in doc
