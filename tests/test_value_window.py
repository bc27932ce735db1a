"""The chargeback's weekly value for money covers the report's own period.

A December report made on December 4th showed weeks 41 to 48: not one day of December. The weeks
now run to the report's end (or now), the last one counted to date, eight weeks at least, and the
anomalies stay those of the last complete week.
"""

from __future__ import annotations

import re

from cost_support import ts
from gpuledger.core.chargeback.value_trends import week_label
from gpuledger.reports.cost.value_html import value_sections
from gpuledger.reports.cost.value_trends import report_weeks, value_trends
from gpuledger.store import Ledger
from value_sim import CARD, REPORT_END, simulate, write


def test_a_december_report_made_on_the_4th_shows_december() -> None:
    weeks, partial = report_weeks(ts("2026-12-01"), ts("2026-12-04T12:00"))
    labels = [week_label(w) for w in weeks]
    assert labels[-1] == "2026-W49" and partial  # Monday November 30th to date
    assert labels == [f"2026-W{n}" for n in range(42, 50)]  # eight weeks: a baseline for the anomalies


def test_a_long_period_shows_all_its_weeks_and_a_finished_month_ends_with_its_last_days() -> None:
    weeks, partial = report_weeks(ts("2026-01-01"), ts("2026-04-01"))
    labels = [week_label(w) for w in weeks]
    assert labels[0] == "2026-W01" and labels[-1] == "2026-W14" and partial  # W14: March 30th and 31st
    weeks, partial = report_weeks(ts("2026-03-02"), ts("2026-03-30"))  # ends on a Monday: no week cut short
    assert week_label(weeks[-1]) == "2026-W13" and not partial and len(weeks) == 8


def test_the_page_says_the_last_week_is_to_date_and_flags_the_last_complete_week(tmp_path) -> None:
    db = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger(db) as ledger:
        write(ledger, simulate())
        whole = value_trends(ledger, scope=None, card=CARD, end=REPORT_END, weeks=5)
        march = value_trends(ledger, scope=None, card=CARD, end=REPORT_END, weeks=5, since=ts("2026-03-01"))
    assert [week_label(w) for w in march.weeks][-2:] == ["2026-W13", "2026-W14"]
    assert march.partial_to == REPORT_END and march.as_dict()["last_week_to"] == "2026-04-01T00:00:00.000Z"
    # The anomalies are the same: those of 2026-W13, the last complete week.
    assert [(a.group, a.metric, week_label(a.week)) for a in march.anomalies] == [
        (a.group, a.metric, week_label(a.week)) for a in whole.anomalies
    ]
    assert march.anomalies and week_label(march.last_complete) == "2026-W13"
    page = value_sections(march)
    assert "2026-W14, counted to 2026-04-01 00:00 UTC" in page
    assert "in the last week (2026-W13)" in page
    assert not re.search(r"\b1 runs", page) and f"{march.runs} runs." in page
