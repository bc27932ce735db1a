"""The shipped Prometheus rules (promtool) and Grafana dashboard only use metrics we export, or series
the shipped recording rules make."""

from __future__ import annotations

import json
import re
import subprocess

import yaml

from gpuledger.prom.names import EXPOSED_NAMES
from prom_support import ALERT_TESTS, ALERTS, DASHBOARD, REPO, need_binary

METRIC = re.compile(r"\bgpuledger_[a-z0-9_]+")
RECORDED = re.compile(r"\b[a-z_]+:gpuledger_[a-z0-9_]+:[a-z0-9_]+")  # level:metric:operations
VALUE_RULES = ALERTS.parent / "gpuledger-value-rules.yml"
VALUE_TESTS = ALERTS.parent / "gpuledger-value-rules.test.yml"
VALUE_ALERTS = {"GpuledgerCostPerMapPointRose", "GpuledgerCostPerEpochRose", "GpuledgerCostPerImageRose"}


def _names(expr: str) -> tuple[set[str], set[str]]:
    """(recorded series, exported metrics) an expression reads."""
    recorded = set(RECORDED.findall(expr))
    return recorded, set(METRIC.findall(RECORDED.sub(" ", expr)))


def _value_rules() -> list[dict]:
    return [r for g in yaml.safe_load(VALUE_RULES.read_text())["groups"] for r in g["rules"]]


def _recorded() -> set[str]:
    return {r["record"] for r in _value_rules() if "record" in r}


def test_alert_rules_pass_promtool_check_and_unit_tests() -> None:
    promtool = need_binary("promtool")
    check = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = subprocess.run(
        [promtool, "test", "rules", ALERT_TESTS.name],
        cwd=ALERT_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "SUCCESS" in tests.stdout


def test_alert_rules_cover_the_three_conditions_with_our_metrics() -> None:
    rules = {r["alert"]: r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}
    assert set(rules) == {"GpuledgerGpuUnderused", "GpuledgerGpuMemoryNearlyFull", "GpuledgerRunsFailingFast"}
    assert "0.20" in rules["GpuledgerGpuUnderused"]["expr"] and rules["GpuledgerGpuUnderused"]["for"] == "15m"
    for rule in rules.values():
        assert set(METRIC.findall(rule["expr"])) <= EXPOSED_NAMES, rule["expr"]
    tested = {
        t["alertname"] for case in yaml.safe_load(ALERT_TESTS.read_text())["tests"] for t in case["alert_rule_test"]
    }
    assert tested == set(rules)


def test_value_rules_pass_promtool_check_and_unit_tests() -> None:
    promtool = need_binary("promtool")
    check = subprocess.run([promtool, "check", "rules", str(VALUE_RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 14 rules found" in check.stdout
    tests = subprocess.run(
        [promtool, "test", "rules", VALUE_TESTS.name],
        cwd=VALUE_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "SUCCESS" in tests.stdout


def test_value_rules_read_exported_gauges_and_earlier_records_and_every_alert_is_tested() -> None:
    defined: set[str] = set()
    alerts = {}
    for rule in _value_rules():
        recorded, exported = _names(rule["expr"])
        assert exported <= EXPOSED_NAMES, rule["expr"]
        assert recorded <= defined, (rule.get("record") or rule.get("alert"), recorded - defined)  # defined above
        if "record" in rule:
            assert RECORDED.fullmatch(rule["record"]) and rule["record"].startswith("model_version:")
            defined.add(rule["record"])
        else:
            alerts[rule["alert"]] = rule
    assert set(alerts) == VALUE_ALERTS
    for rule in alerts.values():  # the documented rule: +25 % over the median of 4 weeks, 3 runs, for 1 h
        assert (
            ">= 0.25" in rule["expr"]
            and "quantile_over_time(0.5," in rule["expr"]
            and "[28d] offset 7d" in rule["expr"]
        )
        assert "count7d >= 3" in rule["expr"] and rule["for"] == "1h"
        assert rule["labels"]["severity"] == "warning"
    # Every expression of the alerts' descriptions (template queries) is a recorded series too.
    for rule in alerts.values():
        assert _names(rule["annotations"]["description"])[0] <= defined
    tested = {
        t["alertname"] for case in yaml.safe_load(VALUE_TESTS.read_text())["tests"] for t in case["alert_rule_test"]
    }
    assert tested == VALUE_ALERTS


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
    used = {m for e in exprs for m in _names(e)[1]}
    assert used <= EXPOSED_NAMES, used - EXPOSED_NAMES
    recorded = {m for e in exprs for m in _names(e)[0]}
    assert recorded <= _recorded(), recorded - _recorded()  # only series gpuledger-value-rules.yml makes
    assert {
        "model_version:gpuledger_cost_per_map_point:7d",
        "model_version:gpuledger_run_cost:sum7d",
        "model_version:gpuledger_run_idle_cost:sum7d",
        "model_version:gpuledger_busy_share:7d",
    } <= recorded
    assert {
        "gpuledger_gpu_busy_seconds_total",
        "gpuledger_gpu_power_watts",
        "gpuledger_gpu_memory_used_bytes",
        "gpuledger_gpu_temperature_celsius",
        "gpuledger_run_cpu_seconds_total",
        "gpuledger_run_info",
    } <= used
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] and dashboard["__inputs"][0]["pluginId"] == "prometheus"


def test_grafana_dashboard_shows_the_value_trend_top_lists_and_alerts() -> None:
    panels = {p["title"]: p for p in json.loads(DASHBOARD.read_text())["panels"]}
    trend = panels["Cost per mAP point by model_version"]
    assert trend["type"] == "timeseries" and "cost_per_map_point:7d" in trend["targets"][0]["expr"]
    tops = [p for t, p in panels.items() if t.startswith("TOP: ")]
    assert len(tops) == 3 and all(p["type"] == "bargauge" for p in tops)
    assert all(t["expr"].startswith("topk(10, ") and t["instant"] for p in tops for t in p["targets"])
    alerts = next(p for p in panels.values() if p["type"] == "alertlist")
    assert alerts["options"]["alertName"] == "GpuledgerCost"
    assert (
        'ALERTS{alertname=~"GpuledgerCost.*"'
        in panels["Value alerts firing (from the ALERTS series)"]["targets"][0]["expr"]
    )
    # The rows below one another, never overlapping: each panel starts where the ones above end.
    grid = sorted((p["gridPos"]["y"], p["gridPos"]["x"], p["gridPos"]["w"], p["gridPos"]["h"]) for p in panels.values())
    cells = set()
    for y, x, w, h in grid:
        for cell in ((yy, xx) for yy in range(y, y + h) for xx in range(x, x + w)):
            assert cell not in cells
            cells.add(cell)


def test_prometheus_doc_lists_every_exported_name_and_the_shipped_files() -> None:
    doc = (REPO / "docs" / "PROMETHEUS.md").read_text()
    for name in EXPOSED_NAMES:
        assert f"`{name}`" in doc, name
    for path in (
        "deploy/prometheus/gpuledger-alerts.yml",
        "deploy/grafana/gpuledger-dashboard.json",
        "--metrics-port",
        "deploy/prometheus/gpuledger-value-rules.yml",
    ):
        assert path in doc
    for name in VALUE_ALERTS | _recorded():
        assert f"`{name}`" in doc, name
