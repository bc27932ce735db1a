"""What the owner of a lost run may still report (core/audit/run_rules.py), and the closed-month
boundary (store/closed_months.py): pure, no database."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpuledger.core.audit.run_rules import LOST_SLACK_S, Span, judge_record
from gpuledger.store import closed_months

LAST_ROW = 1_000.0  # the end of the lost run's last interval
LOST: dict[str, Any] = {
    "id": "r", "user": "ana", "host": "n1", "command": ["python"], "started_at": 100.0, "status": "lost",
    "ended_at": 990.0, "exit_code": None, "signal": None, "status_reason": "recorder died", "name": "train",
    "labels": {"team": "vision"}, "team": "vision", "meta": {},
}  # fmt: skip


def _judge(**sent: Any) -> Any:
    return judge_record("r", LOST, {**LOST, **sent}, LAST_ROW)


def test_the_owner_of_a_lost_run_may_report_how_it_ended() -> None:
    verdict = _judge(status="succeeded", ended_at=LAST_ROW + 60, exit_code=0, status_reason=None)
    assert verdict.refusal is None and verdict.ended_now
    assert verdict.changes == {"status": "succeeded", "ended_at": LAST_ROW + 60, "exit_code": 0, "status_reason": None}
    assert verdict.old == {"status": "lost", "ended_at": 990.0, "exit_code": None, "status_reason": "recorder died"}
    assert _judge(status="failed", exit_code=1).refusal is None  # the end as the verdict gave it
    assert _judge(status="killed", ended_at=LAST_ROW + LOST_SLACK_S, signal=9).refusal is None  # the slack's edge


def test_a_lost_run_gets_no_other_change() -> None:
    for field, value in (("labels", {"team": "billing"}), ("team", "billing"), ("name", "other"), ("meta", {"a": 1})):
        refusal = _judge(status="succeeded", **{field: value}).refusal or ""
        assert "may report only how it ended" in refusal and field in refusal, field


def test_a_lost_runs_end_stays_near_its_last_interval() -> None:
    forty_days = _judge(status="succeeded", ended_at=LAST_ROW + 40 * 86400).refusal or ""
    assert "its end may lie between its last interval" in forty_days
    assert "its end may lie" in (_judge(status="succeeded", ended_at=LAST_ROW + LOST_SLACK_S + 1).refusal or "")
    assert "its end may lie" in (_judge(status="succeeded", ended_at=LAST_ROW - 600).refusal or "")  # before it
    assert "cannot be removed" in (_judge(status="succeeded", ended_at=None).refusal or "")
    # Without a row the verdict's own end (the last sign of life) is the anchor.
    assert judge_record("r", LOST, {**LOST, "status": "succeeded", "ended_at": 990.0 + 3000}).refusal is None
    assert judge_record("r", LOST, {**LOST, "status": "succeeded", "ended_at": 990.0 + 9000}).refusal


def test_a_lost_runs_end_moves_only_with_its_status() -> None:
    assert "not alone" in (_judge(ended_at=LAST_ROW + 60).refusal or "")
    assert _judge(status_reason="agent: out of memory", exit_code=137).refusal is None  # still lost, reason given
    assert judge_record("r", {**LOST, "status": "succeeded"}, {**LOST, "status": "failed"}).refusal  # final is final


def test_a_lost_runs_late_rows_are_bounded() -> None:
    span = Span.of(LOST)
    assert span.refusal(980.0, 990.0 + LOST_SLACK_S - 10) is None
    assert "after the run ended" in (span.refusal(980.0, 990.0 + 6 * 86400) or "")
    closed = Span(100.0, None, closed=500.0)
    assert "closed month" in (closed.refusal(400.0, 600.0) or "")
    assert closed.refusal(500.0, 600.0) is None


def _t(*args: int) -> float:
    return dt.datetime(*args, tzinfo=dt.timezone.utc).timestamp()


def test_a_month_closes_days_after_it_ends() -> None:
    assert closed_months.boundary(_t(2026, 12, 4, 20), 3) == _t(2026, 12, 1)  # November closed on Dec 4
    assert closed_months.boundary(_t(2026, 12, 3, 23), 3) == _t(2026, 11, 1)  # ... not yet on Dec 3
    assert closed_months.boundary(_t(2027, 1, 2), 3) == _t(2026, 12, 1)  # across a year
    assert closed_months.boundary(_t(2026, 12, 1, 0, 1), 0) == _t(2026, 12, 1)  # no grace at all
    assert closed_months.boundary(_t(2026, 12, 4, 20), 62) == _t(2026, 10, 1)  # a window longer than a month
    assert closed_months.closes_at(_t(2026, 11, 15), 3) == _t(2026, 12, 4)


def test_a_swept_runs_end_may_reach_past_its_last_sign_of_life() -> None:
    # The sweep heard of it (a push without intervals) until 5,000: its end may follow that.
    def judge(end: float) -> str | None:
        return judge_record("r", LOST, {**LOST, "status": "failed", "ended_at": end}, LAST_ROW, 5_000.0).refusal

    assert judge(4_000.0) is None and judge(5_000.0 + LOST_SLACK_S) is None
    assert "its end may lie" in (judge(5_000.0 + LOST_SLACK_S + 1) or "")
    assert "its end may lie" in (judge(LAST_ROW - 60) or "")  # never before its last interval
