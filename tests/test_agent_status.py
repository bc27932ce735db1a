"""The ``discovered`` status: open while its agent has not set an end, finished once it has, in
every place that tells running runs from finished ones (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from cost_support import H, card, ts
from gpuledger.core.audit.run_rules import Span, is_final, judge_record
from gpuledger.core.model import DISCOVERED, RUN_STATUSES, GpuIdentity, GpuInterval, RunRecord, run_is_open
from gpuledger.core.pricing.usage import partial_flag
from gpuledger.reports.cost.costing import chargeback, month_window, run_costs
from gpuledger.reports.cost.rollups import materialise_rollups
from gpuledger.store import Ledger
from gpuledger.store import cost_queries as cq
from gpuledger.store.metrics_queries import live_runs
from gpuledger.store.queries import open_discovered_on

CARD = card('[[gpu]]\nmodel = "A100-40GB-SXM"\nprice_per_hour = "2.00"\n')
A100 = "NVIDIA A100-SXM4-40GB"


def test_open_and_final_are_one_rule() -> None:
    assert DISCOVERED in RUN_STATUSES
    assert run_is_open(DISCOVERED, None) and not run_is_open(DISCOVERED, 1.0)
    assert run_is_open("running", None) and not run_is_open("succeeded", 1.0)
    assert is_final(DISCOVERED, 1.0) and not is_final(DISCOVERED, None)
    assert partial_flag(DISCOVERED, None) == "running" and partial_flag(DISCOVERED, 5.0) is None
    assert Span.of({"status": DISCOVERED, "started_at": 1.0, "ended_at": 9.0}).end == 9.0
    assert Span.of({"status": DISCOVERED, "started_at": 1.0, "ended_at": None}).end is None


def test_a_pushed_discovered_run_can_be_ended_once_and_then_is_final() -> None:
    open_row = {"status": DISCOVERED, "ended_at": None, "labels": {"team": "a"}}
    ending = judge_record("r", open_row, {**open_row, "ended_at": 50.0, "exit_code": 0})
    assert ending.refusal is None and ending.ended_now and ending.changes == {"ended_at": 50.0, "exit_code": 0}
    labels = judge_record("r", open_row, {**open_row, "labels": {"team": "b"}})
    assert labels.changes == {"labels": {"team": "b"}} and not labels.ended_now
    ended = {**open_row, "ended_at": 50.0, "exit_code": 0}
    assert judge_record("r", ended, {**open_row}).stale  # a late copy from before the end: ignored
    refused = judge_record("r", ended, {**ended, "labels": {"team": "c"}})
    assert refused.refusal is not None and "final" in refused.refusal


def _discovered(led: Ledger, rid: str, start: float, hours: float, *, ended: bool, team: str = "vision") -> None:
    led.create_run(
        RunRecord(
            id=rid, command=["python", "train.py"], user="root", host="gpu-node-1", cwd="", started_at=start,
            status=DISCOVERED, ended_at=start + hours * H if ended else None, labels={"team": team, "project": "det"},
        )
    )  # fmt: skip
    uuid = f"GPU-{rid}"
    led.add_devices(rid, [GpuIdentity(0, uuid, A100)])
    ivs, t, seq = [], start, 0
    while t < start + hours * H:
        ivs.append(GpuInterval(uuid, seq, t, t + 600, busy_s=300.0, energy_j=600 * 250.0))
        t, seq = t + 600, seq + 1
    led.append(rid, gpu=ivs)


@pytest.fixture
def ledger(ledger_url: str) -> Ledger:
    led = Ledger(ledger_url)
    yield led
    led.close()


def test_ledger_treats_an_ended_discovered_run_as_finished_and_an_open_one_as_running(ledger: Ledger) -> None:
    t = ts("2026-03-10T00:00")
    _discovered(ledger, "open-run", t, 2, ended=False)
    _discovered(ledger, "done-run", t, 3, ended=True, team="nlp")
    candidates = ledger.read(lambda c: cq.rollup_candidates(c, rebuild=False))
    assert "done-run" in candidates and "open-run" not in candidates  # never roll up a run still recording
    live = {r["id"] for r in ledger.read(lambda c: live_runs(c, ended_since=t + 10 * H, limit=10, scope=None))}
    assert live == {"open-run"}  # /metrics follows the open one
    assert [r["id"] for r in ledger.read(lambda c: open_discovered_on(c, "gpu-node-1"))] == ["open-run"]
    assert ledger.read(lambda c: open_discovered_on(c, "elsewhere")) == []

    costs = {r["run_id"]: r for r in run_costs(ledger, ["open-run", "done-run"], scope=None, card=CARD)["runs"]}
    assert costs["open-run"]["partial"] and "running" in costs["open-run"]["total"]["flags"]
    assert not costs["done-run"]["partial"]
    assert costs["done-run"]["total"]["allocated_gpu_h"] == pytest.approx(3.0)
    assert costs["done-run"]["total"]["busy_gpu_h"] == pytest.approx(1.5)

    lo, hi = month_window("2026-03")
    cb = chargeback(ledger, scope=None, card=CARD, start=lo, end=hi, by=("team",), trend_months=1)
    teams = {g["team"]: g for g in cb.groups}
    assert teams["nlp"]["allocated_gpu_h"] == pytest.approx(3.0) and teams["nlp"]["partial_runs"] == 0
    assert teams["vision"]["partial_runs"] == 1  # the open one, priced up to its last interval

    assert materialise_rollups(ledger)["runs"] == 1  # the ended discovered run, like any finished run
    ledger.update_run("open-run", ended_at=t + 2 * H)
    assert "open-run" in ledger.read(lambda c: cq.rollup_candidates(c, rebuild=False))
