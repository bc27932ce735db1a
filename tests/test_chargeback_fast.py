"""The columnar chargeback path (core/chargeback/fast.py) against the per-row path: for any rollup
rows, runs, groupings and basis, the whole report (groups, total, top runs and users, trend,
warnings) is identical, to the last unit of money."""

from __future__ import annotations

import bisect

from hypothesis import given, settings
from hypothesis import strategies as st

from cost_support import card, ts
from gpuledger.core.chargeback.fast import price_plain_rows
from gpuledger.core.chargeback.report import build_from_compact, grouping
from gpuledger.core.pricing.cost import Pricer
from gpuledger.core.pricing.usage import DAY_S, day_of
from gpuledger.reports.cost.usage import RunRow

START, END = ts("2026-03-01"), ts("2026-04-01")
CARD = card(
    """
[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "2.50"
effective_to = 2026-03-10

[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "2.875"
effective_from = 2026-03-10
power_price_per_kwh = "0.17"
pue = "1.35"

[[gpu]]
model = "T4"
price_per_hour = "0.526"

[[gpu]]
model = "A100-80GB-SXM"
price_per_hour = "3.43"
effective_from = 2026-03-20T12:00:00Z

[[instance]]
type = "p4d.24xlarge"
gpu_model = "A100-40GB-SXM"
gpus = 8
"""
)
NAMES = ["NVIDIA A100-SXM4-40GB", "Tesla T4", "NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-80GB", ""]
INSTANCES = [None, "p4d.24xlarge", "p5.48xlarge"]  # p5 is not on the card: flagged unknown_instance
BY = [("team",), ("team", "project", "user", "gpu_model"), ("instance_type", "user"), ("gpu_model",), ("project",)]


@st.composite
def ledger_rows(draw: st.DrawFn) -> tuple[dict[str, RunRow], list[tuple[object, ...]]]:
    n_runs = draw(st.integers(1, 12))
    runs: dict[str, RunRow] = {}
    for i in range(n_runs):
        rid = f"run{i:02d}"
        attempt_of = f"run{i - 1:02d}" if i and draw(st.integers(0, 5)) == 0 else None
        status = draw(st.sampled_from(["succeeded", "succeeded", "killed", "lost", "failed"]))
        runs[rid] = RunRow(
            rid,
            status,
            draw(st.sampled_from(["ana", "bo", "cy"])),
            draw(st.sampled_from(["vision", "nlp", None])),
            draw(st.sampled_from(["det", "llm"])),
            None,
            START - 86400.0,
            END,
            attempt_of,
            None,
            rid,
        )
    for rid, run in list(runs.items()):  # a resumed run's logical id: the first attempt of its chain
        root = rid
        while runs[root].attempt_of in runs:
            root = runs[root].attempt_of  # type: ignore[assignment]
        runs[rid] = run._replace(logical_id=root)
    rows = []
    for _ in range(draw(st.integers(0, 40))):
        rid = draw(st.sampled_from(sorted(runs)))
        day = day_of(START) + draw(st.integers(-2, 31))  # a few rows outside the window
        a = day * DAY_S + draw(st.floats(0, 80000))
        b = min(a + draw(st.floats(0, 30000)), (day + 1) * DAY_S)
        gpus = draw(st.integers(1, 8))
        alloc = (b - a) * gpus
        busy = draw(st.one_of(st.none(), st.floats(0, 1).map(lambda u, alloc=alloc: alloc * u)))
        energy = draw(st.one_of(st.none(), st.floats(0, 700 * max(alloc, 1.0))))
        name = draw(st.sampled_from(NAMES))
        profile = draw(st.sampled_from(["", "", "", "3g.20gb"])) if "A100" in name else ""
        rule = draw(st.sampled_from([None, None, None, "sm", "equal"]))
        instance = draw(st.sampled_from(INSTANCES))
        rows.append((rid, day, name, profile, a, b, alloc, busy, energy, rule, instance))
    unique = {(r[0], r[1], r[2], r[3]): r for r in rows}  # the table's key
    return runs, list(unique.values())


def _report(runs, rows, by, basis, *, columnar: bool):  # type: ignore[no-untyped-def]
    edges = sorted({START, END, *CARD.change_points})
    mid_day = sorted({day_of(t) for t in edges if t % DAY_S and START <= t < END})
    period_days = sorted({day_of(t) for t in edges} | {d + 1 for d in mid_day})
    periods = [(float((period_days[0] - 1) * DAY_S), True)]
    periods += [(float(d * DAY_S), d not in mid_day) for d in period_days]
    period_of_day = {d: bisect.bisect_right(period_days, d) for d in range(day_of(START) - 3, day_of(END) + 3)}
    pricer = Pricer(CARD, basis, START, END)
    fast = None
    if columnar:
        run_keys, by_model, by_instance = grouping(by)
        fast, rows = price_plain_rows(
            rows,
            runs,
            pricer,
            period_of_day,
            periods,
            start=START,
            end=END,
            run_keys=run_keys,
            by_model=by_model,
            by_instance=by_instance,
        )
    items = pricer.price_rollups(rows, runs, period_of_day, periods)
    report = build_from_compact(items, runs, by=by, start=START, months=["2026-03"], top_n=3, fast=fast)
    return report.as_dict()


@settings(max_examples=200, deadline=None)
@given(ledger_rows(), st.sampled_from(BY), st.sampled_from(["busy", "allocated"]))
def test_the_columnar_path_gives_the_same_report_as_the_per_row_path(data, by, basis) -> None:  # type: ignore[no-untyped-def]
    runs, rows = data
    assert _report(runs, rows, by, basis, columnar=True) == _report(runs, rows, by, basis, columnar=False)


def test_plain_rows_go_columnar_and_unusual_ones_do_not() -> None:
    run = RunRow("r", "succeeded", "ana", "vision", "det", None, START, END, None, None, "r")
    day = day_of(START) + 1
    t = day * DAY_S
    plain = ("r", day, "Tesla T4", "", t, t + 3600, 3600.0, 1800.0, 1e5, None, None)
    mig = ("r", day, "NVIDIA A100-SXM4-40GB", "3g.20gb", t, t + 3600, 3600.0, 1800.0, None, None, None)
    shared = ("r", day + 1, "Tesla T4", "", t, t + 3600, 3600.0, 1800.0, None, "sm", None)
    unmeasured = ("r", day + 2, "Tesla T4", "", t, t + 3600, 3600.0, None, None, None, None)
    unpriced = ("r", day, "NVIDIA GeForce RTX 4090", "", t, t + 3600, 3600.0, 1800.0, None, None, None)
    rows = [plain, mig, shared, unmeasured, unpriced]
    period_of_day = {d: 0 for d in range(day - 1, day + 4)}
    fast, slow = price_plain_rows(
        rows,
        {"r": run},
        Pricer(CARD, None, START, END),
        period_of_day,
        [(t, True)],
        start=START,
        end=END,
        run_keys=["team"],
        by_model=False,
        by_instance=False,
    )
    assert slow == [mig, shared, unmeasured, unpriced]
    assert fast.members == {("vision",): {"r"}}
    ((key, month), vector) = next(iter(fast.cells.items()))
    assert (key, month) == (("vision",), "2026-03")
    assert vector[:2] == [1_000_000, 500_000]  # one held hour, half of it busy (µh)
    assert vector[5] == 500_000 * 526_000_000_000_000  # busy µh x $0.526/h in 10^-21 units per µh
