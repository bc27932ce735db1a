"""The anomaly "inference slower than the previous version on the same data and hardware" where
managers look (issue 37): the value trends' anomalies of GET /api/v1/reports/value-trends (the
dashboard overview's list) and the chargeback HTML's value section, beside the inference cells.

Two chained trainings v1 -> v2 (v2 fine-tuned from v1's best.pt) and one `yolo val` of each one's
weights on the same split; v2's evaluation is 20 % slower (12 vs 10 ms/image). Hand-made
evaluation meta, as tests/test_inference_rule.py writes it.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.cli.main import cli
from gpuledger.core.diagnosis.inference_rules import InferenceSlower, value_anomaly
from gpuledger.core.model import GpuIdentity, GpuInterval, RunRecord
from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, accounts
from value_sim import CARD_TEXT

W1, W2 = "1" * 64, "2" * 64
A100, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
V1, V2 = "0190c0c0-0000-7000-8000-0000000005a1", "0190c0c0-0000-7000-8000-0000000005a2"
E1, E2 = "0190c0c0-0000-7000-8000-0000000005e1", "0190c0c0-0000-7000-8000-0000000005e2"
NOW = time.time()


def _training(version: str, produced: str, source: str | None) -> dict:
    src = None if source is None else {"path": "/runs/v1/best.pt", "sha256": source}
    lineage = {"model_line": "yolov8n", "model_version": version, "weights_sha256": produced, "source_weights": src}
    return {"framework": "ultralytics", "lineage": lineage}


def _evaluation(sha: str, ms: float, gpu: str) -> dict:
    return {
        "kind": "evaluation",
        "evaluation": {
            "mode": "val", "weights": {"path": "/w/best.pt", "sha256": sha}, "imgsz": 640, "batch": 16,
            "precision": "fp32", "device": "0", "gpu_model": gpu, "images": 5000, "energy_j": 1500.0,
            "split": {"name": "val", "fingerprint": "f" * 64}, "ms_per_image": {"inference": ms},
        },
    }  # fmt: skip


def _run(led: Ledger, rid: str, start: float, minutes: int, meta: dict, gpu: str = A100) -> None:
    led.create_run(
        RunRecord(
            id=rid, command=["yolo"], user="ana", host="box", cwd="/w", started_at=start, status="succeeded",
            ended_at=start + minutes * 60, meta=meta, labels={"project": "detector"},
        )
    )  # fmt: skip
    uuid = f"GPU-{rid[-4:]}"
    led.add_devices(rid, [GpuIdentity(0, uuid, gpu, memory_total_b=80 * 2**30)])
    led.append(rid, gpu=[GpuInterval(uuid, k, start + k * 60, start + k * 60 + 60, samples=60, busy_s=30.0,
                                     energy_j=18000.0) for k in range(minutes)])  # fmt: skip


def _ledger(url: str, v2_gpu: str) -> None:
    with Ledger(url) as led:
        _run(led, V1, NOW - 3 * 86400, 30, _training("v1", W1, None))
        _run(led, V2, NOW - 2 * 86400, 30, _training("v2", W2, W1))
        _run(led, E1, NOW - 4 * 3600, 5, _evaluation(W1, 10.0, A100))
        _run(led, E2, NOW - 2 * 3600, 5, _evaluation(W2, 12.0, v2_gpu), v2_gpu)


def _rates(tmp_path: Path) -> Path:
    rates = tmp_path / "rates.toml"
    rates.write_text(f'[card]\ncurrency = "USD"\nbasis = "allocated"\n{CARD_TEXT}')
    return rates


def _api(tmp_path: Path, v2_gpu: str, member_of: str | None = None) -> dict:
    url = f"sqlite:///{tmp_path}/server.db"
    _ledger(url, v2_gpu)
    with Ledger(url) as led:
        for project in ("detector", "speech"):
            accounts.add_project(led, project, actor="test")
        if member_of is None:
            token = accounts.issue_token(led, "root", role="admin", actor="test", create_user=True)[1]
        else:
            token = accounts.issue_token(led, "bo", role="member", actor="test", create_user=True)[1]
            accounts.add_member(led, "bo", member_of, actor="test")
    settings = Settings(rates=str(_rates(tmp_path)), token_cache_s=0)
    with TestClient(create_app(url, settings=settings)) as c:
        got = c.get("/api/v1/reports/value-trends", headers={"Authorization": f"Bearer {token}"})
    assert got.status_code == 200, got.text
    return got.json()


def _slower(anomalies: list[dict]) -> list[dict]:
    return [a for a in anomalies if a.get("rule") == "inference_slower"]


def test_the_value_trends_api_flags_v2_slower_on_the_same_split_and_gpu(tmp_path: Path) -> None:
    body = _api(tmp_path, A100)
    (found,) = _slower(body["anomalies"])
    assert found["model_version"] == "v2" and found["previous_version"] == "v1"
    assert (found["baseline"], found["current"], found["change"]) == ("10", "12", 0.2)
    assert "10 -> 12 ms/image (+20 %)" in found["message"]
    (cause,) = found["causes"]
    assert f"split {'f' * 12}" in cause["text"] and f"GPU {A100}" in cause["text"]
    assert (cause["figures"]["evaluation"], cause["figures"]["previous_evaluation"]) == (E2, E1)
    cells = {c["model_version"]: c for c in body["inference"]}
    assert cells["v2"]["images"] == 5000 and cells["v2"]["j_per_image"] == 0.3


def test_not_flagged_when_the_gpu_model_differs(tmp_path: Path) -> None:
    body = _api(tmp_path, H100)  # v2 evaluated on another GPU model: a slower figure says nothing
    assert _slower(body["anomalies"]) == []
    assert {c["model_version"] for c in body["inference"]} == {"v1", "v2"}  # the cells are still shown


def test_a_member_of_another_project_sees_neither_the_finding_nor_the_cells(tmp_path: Path) -> None:
    body = _api(tmp_path, A100, member_of="speech")
    assert body["anomalies"] == [] and body["inference"] == []


@given(st.floats(0.5, 50), st.floats(0.01, 3))
def test_the_anomaly_entry_carries_the_rules_figures(prev_ms: float, ratio: float) -> None:
    found = InferenceSlower("t2", "t1", E2, E1, prev_ms * (1 + ratio), prev_ms)
    conditions = {"split": "a" * 64, "gpu_model": A100}
    entry = value_anomaly(found, by="model_version", version="v2", previous_version="v1", week="2026-W49",
                          conditions=conditions)  # fmt: skip
    assert entry["change"] == pytest.approx(ratio, abs=1e-6)
    assert (float(entry["baseline"]), float(entry["current"])) == pytest.approx((prev_ms, prev_ms * (1 + ratio)))
    assert entry["message"].endswith(f"(+{found.slowdown_pct:.0f} %)") and "v1" in entry["message"]
    assert entry["causes"][0]["figures"]["slowdown_pct"] == pytest.approx(ratio * 100, abs=1e-3)


def _chargeback(tmp_path: Path, v2_gpu: str) -> str:
    db = f"sqlite:///{tmp_path}/cli.db"
    _ledger(db, v2_gpu)
    out = tmp_path / "chargeback.html"
    args = ["report", "chargeback", "--format", "html", "--rates", str(_rates(tmp_path)), "--db", db, "-o", str(out)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    return out.read_text()


def test_the_chargeback_html_shows_the_finding_and_the_inference_cells(tmp_path: Path) -> None:
    page = _chargeback(tmp_path, A100)
    section = page[page.index('id="value-anomalies"') :]
    assert "v2: inference slower than v1 on the same data and hardware: 10 -&gt; 12 ms/image (+20 %)" in section
    row = re.search(r'<table class="anomaly-table inference-slower">.*?<tbody>(.*?)</tbody>', section).group(1)
    assert "<td>v2</td>" in row and "<td>v1</td><td>10.0</td><td>12.0</td><td>+20%</td>" in row
    inference = re.search(r'<table class="inference">.*?<tbody>(.*?)</tbody>', page).group(1)
    v2 = re.search(r"<tr><td>v2</td><td>\d{4}-W\d{2}</td>(.*?)</tr>", inference).group(1)
    # 5 allocated minutes at 3.43 USD/h for 5,000 images: 0.286 USD, 0.0572 per 1,000; 1,500 J / 5,000 images
    assert v2 == "<td>1</td><td>5,000</td><td>0.29</td><td>0.0572</td><td>0.300</td>"
    twin = json.loads(re.search(r'id="value-trends-data"[^>]*>(.*?)</script>', page, re.S).group(1))
    assert [a["model_version"] for a in _slower(twin["anomalies"])] == ["v2"]


def test_the_chargeback_html_says_nothing_when_the_gpu_model_differs(tmp_path: Path) -> None:
    page = _chargeback(tmp_path, H100)
    assert "inference slower" not in page and '<table class="inference">' in page


def test_chromium_shows_the_finding_and_the_inference_table_offline(tmp_path: Path) -> None:
    from browser_support import ARGS, CHROMIUM, need_browser

    sync_playwright = need_browser()
    page_file = tmp_path / "page.html"
    page_file.write_text(_chargeback(tmp_path, A100))
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1000, "height": 900})
        page.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on("request", lambda r: None if r.url.startswith(("file:", "data:")) else problems.append(r.url))
        page.goto(page_file.as_uri())
        assert page.locator("#value-inference").is_visible() and page.locator("table.inference").is_visible()
        item = page.locator("#value-anomalies ~ ul li.anomaly").first.inner_text()
        assert item == "v2: inference slower than v1 on the same data and hardware: 10 -> 12 ms/image (+20 %)"
        cause = page.locator("table.inference-slower td.text").inner_text()
        assert cause.startswith("v2 (evaluation ") and cause.endswith(f"on the same split {'f' * 12}, GPU {A100}")
        browser.close()
    assert problems == []


def test_the_dashboard_overview_lists_the_finding(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from browser_support import ARGS, CHROMIUM, need_browser
    from dashboard_support import uvicorn_server, wait_js

    sync_playwright = need_browser()
    db = f"sqlite:///{tmp_path}/server.db"
    _ledger(db, A100)
    with Ledger(db) as led:
        token = accounts.issue_token(led, "root", role="admin", actor="test", create_user=True)[1]
    monkeypatch.setenv("GPULEDGER_RATES", str(_rates(tmp_path)))  # the server prices with this card
    problems: list[str] = []
    with uvicorn_server(db, tmp_path / "server.log") as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.goto(base + "/dashboard/login")
        page.evaluate("t => sessionStorage.setItem('gpuledger.token', t)", token)
        page.goto(base + "/dashboard/")
        wait_js(page, "document.querySelector('#anomalies li.anomaly') !== null", timeout=60, what="the anomalies")
        items = page.locator("#anomalies li.anomaly").all_inner_texts()
        browser.close()
    assert items == ["v2: inference slower than v1 on the same data and hardware: 10 -> 12 ms/image (+20 %)"]
    assert problems == []
