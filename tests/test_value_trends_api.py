"""GET /api/v1/reports/value-trends: the dashboard's weekly value for money, scoped to the caller.

Weeks of simulated YOLO trainings of project "detector" (tests/value_sim.py) on a team server: an
admin gets the weeks of March to its end and the yolov5m anomaly with its cause; a member of
another project gets nothing of them; a bad or future month is one clear 422.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, accounts
from value_sim import CARD_TEXT, simulate, write


@pytest.fixture
def client(tmp_path: Path):
    url = f"sqlite:///{tmp_path}/server.db"
    with Ledger(url) as led:
        write(led, simulate())
        accounts.add_project(led, "detector", actor="test")
        accounts.add_project(led, "speech", actor="test")
        tokens = {
            "admin": accounts.issue_token(led, "root", role="admin", actor="test", create_user=True)[1],
            "other": accounts.issue_token(led, "bo", role="member", actor="test", create_user=True)[1],
        }
        accounts.add_member(led, "bo", "speech", actor="test")
    rates = tmp_path / "rates.toml"
    rates.write_text(f'[card]\ncurrency = "USD"\nbasis = "allocated"\n{CARD_TEXT}')
    with TestClient(create_app(url, settings=Settings(rates=str(rates), token_cache_s=0))) as c:
        yield c, tokens


def _get(c: TestClient, token: str, **params: str):
    return c.get("/api/v1/reports/value-trends", params=params, headers={"Authorization": f"Bearer {token}"})


def test_the_weeks_of_the_month_to_its_end_with_the_anomaly_and_its_cause(client) -> None:
    c, tokens = client
    got = _get(c, tokens["admin"], month="2026-03")
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["weeks"][-2:] == ["2026-W13", "2026-W14"] and body["last_week_to"] == "2026-04-01T00:00:00.000Z"
    first = body["anomalies"][0]
    assert (first["model_version"], first["week"]) == ("yolov5m", "2026-W13")
    assert "batch changed 64 → 16" in first["message"]
    assert body["top_by_cost"][0]["model_version"] == "yolov5m"


def test_a_member_of_another_project_sees_none_of_it(client) -> None:
    c, tokens = client
    got = _get(c, tokens["other"], month="2026-03")
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["series"] == [] and body["anomalies"] == [] and "yolov5m" not in got.text


@pytest.mark.parametrize("month", ["2026-13", "March", "2999-01"])
def test_a_bad_month_is_one_clear_error(client, month: str) -> None:
    c, tokens = client
    got = _get(c, tokens["admin"], month=month)
    assert got.status_code == 422, got.text
