"""Unmeasured GPU time is summed tick by tick, never judged from a merged method.

A tick's unknown time (samples lost) is measured by the instant reading, or else unmeasured. An
interval of ticks where the instant reading worked on one tick and failed on another has the
method "instant,samples" for all of its unknown time; only the per-tick sum, stored with the
interval (``util_unmeasured_s``, migration 12), says how much of it nobody measured. Run totals
(``gpuledger show``, from sums the database computes), report buckets and exports add up those
per-interval figures; intervals stored before the column are judged by their own method.
"""

from __future__ import annotations

import csv
import io
import json
import math

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.cli.main import cli
from gpuledger.collect.fake_nvml import Failing, FakeGpu, TracePoint
from gpuledger.core.metering.busy import CARRY_MAX_S, unmeasured_seconds
from gpuledger.core.metering.intervals import merge_gpu_intervals, merge_gpu_ticks
from gpuledger.core.model import GpuIdentity, GpuTick, RunRecord
from gpuledger.reports.run.export import interval_rows, stream_rows, to_csv, write_csv
from gpuledger.runs.view import summary
from gpuledger.store import Ledger, schema
from gpuledger.store.migrations import LATEST
from nvml_support import T0, make, run

RUN = "0190aaaa-0000-7000-8000-00000000e121"
UUID = "GPU-e121"
H100 = "NVIDIA H100 80GB HBM3"


def _tick(t0: float, unknown: float | None, method: str | None, busy: float = 0.5) -> GpuTick:
    return GpuTick(UUID, t0, t0 + 1.0, busy_s=busy, util_method=method, util_unknown_s=unknown)


def test_an_interval_keeps_apart_the_unknown_time_one_tick_measured_and_another_did_not() -> None:
    ticks = [
        _tick(0.0, 0.0, "samples"),
        _tick(1.0, 0.75, "instant,samples"),  # the instant reading measured these 0.75 s
        _tick(2.0, 0.5, "samples"),  # it failed here: these 0.5 s nobody measured
    ]
    iv = merge_gpu_ticks(UUID, 0, ticks)
    assert iv.util_method == "instant,samples" and iv.util_unknown_s == pytest.approx(1.25)
    assert iv.util_unmeasured_s == pytest.approx(0.5)
    assert unmeasured_seconds(iv) == pytest.approx(0.5)  # the merged method alone would say 0
    # coarser merges (rollups, report buckets) keep the exact figure
    again = merge_gpu_intervals([iv, merge_gpu_ticks(UUID, 1, [_tick(3.0, 1.0, "samples")])])
    assert unmeasured_seconds(again) == pytest.approx(1.5)


def test_an_interval_that_says_nothing_of_coverage_has_no_unmeasured_figure() -> None:
    iv = merge_gpu_ticks(UUID, 0, [_tick(0.0, None, "instant"), _tick(1.0, None, "instant")])
    assert iv.util_unmeasured_s is None and unmeasured_seconds(iv) == 0.0
    assert merge_gpu_ticks(UUID, 0, [_tick(0.0, 0.0, "samples")]).util_unmeasured_s == 0.0


_METHODS = st.sampled_from(["samples", "instant,samples", "instant", None])


@st.composite
def _ticks_and_cuts(draw: st.DrawFn) -> tuple[list[GpuTick], list[int]]:
    n = draw(st.integers(1, 12))
    ticks = []
    t = 0.0
    for _ in range(n):
        span = draw(st.floats(0.0, 5.0, allow_nan=False))
        unknown = draw(st.one_of(st.none(), st.floats(0.0, 10.0, allow_nan=False)))
        ticks.append(GpuTick(UUID, t, t + span, busy_s=0.0, util_method=draw(_METHODS), util_unknown_s=unknown))
        t += span
    cuts = sorted(set(draw(st.lists(st.integers(1, n), max_size=n))) | {n})
    return ticks, cuts


@settings(max_examples=300, deadline=None)
@given(_ticks_and_cuts())
def test_any_grouping_of_the_same_ticks_has_the_same_unmeasured_time(case: tuple[list[GpuTick], list[int]]) -> None:
    ticks, cuts = case
    truth = math.fsum(unmeasured_seconds(t) for t in ticks)  # a tick is judged by its own method
    groups, start = [], 0
    for seq, end in enumerate(cuts):
        groups.append(merge_gpu_ticks(UUID, seq, ticks[start:end]))
        start = end
    assert math.fsum(unmeasured_seconds(g) for g in groups) == pytest.approx(truth, abs=1e-9)
    assert unmeasured_seconds(merge_gpu_intervals(groups)) == pytest.approx(truth, abs=1e-9)
    assert unmeasured_seconds(merge_gpu_ticks(UUID, 0, ticks)) == pytest.approx(truth, abs=1e-9)


def test_the_collector_and_the_merge_record_the_instant_readings_failure_within_one_interval() -> None:
    # A busy H100. The buffer read fails at two reads of one 5 s interval (passing errors); the
    # instant reading answers at the first, fails at the second.
    gpu = FakeGpu(UUID, name=H100, points=[TracePoint(0, util_pct=100)], failing=[
        Failing("nvmlDeviceGetSamples", 10.5, 11.5), Failing("nvmlDeviceGetSamples", 12.5, 13.5),
        Failing("nvmlDeviceGetUtilizationRates", 12.5, 13.5),
    ])  # fmt: skip
    col, _, clock = make([gpu])
    ticks, _ = run(col, clock, 20)
    interval = [t for t in ticks if 10 < t.t1 - T0 <= 15]
    measured = next(t for t in interval if t.t1 - T0 == 11)
    lost = next(t for t in interval if t.t1 - T0 == 13)
    assert measured.util_method == "instant,samples" and lost.util_method == "samples"
    iv = merge_gpu_ticks(UUID, 2, interval)
    assert iv.util_method == "instant,samples"
    # The lost read's second, and the time after the newest sample that the read before left to it:
    # nobody measured either, so neither is idle (issue 34).
    assert 1.0 < lost.util_unknown_s <= 1.0 + CARRY_MAX_S
    assert iv.util_unmeasured_s == pytest.approx(lost.util_unknown_s) == unmeasured_seconds(lost)
    assert iv.busy_s == pytest.approx(4.0, abs=0.2)  # the unmeasured second is not guessed busy


def _run_with_mixed_intervals(led: Ledger, exact: bool) -> RunRecord:
    """Ten 5 s intervals at 60 % busy: intervals 2 and 3 lost 2 s of samples that the instant
    reading measured; intervals 6 and 7 lost 1.5 s nobody measured (stored without the exact
    column when not ``exact``: a ledger written before migration 12); interval 8 mixes both."""
    run_ = RunRecord(id=RUN, command=["python", "train.py"], user="u", host="h", cwd="/", started_at=T0,
                     status="succeeded", ended_at=T0 + 50)  # fmt: skip
    led.create_run(run_)
    led.add_devices(RUN, [GpuIdentity(index=0, uuid=UUID, name=H100)])
    ivs = []
    for i in range(10):
        t0 = T0 + 5 * i
        if i in (2, 3):
            ticks = [_tick(t0 + k, 0.4 if k < 5 else 0.0, "instant,samples", busy=0.6) for k in range(5)]
        elif i in (6, 7):
            ticks = [_tick(t0 + k, 0.3, "samples", busy=0.3) for k in range(5)]
        elif i == 8:
            ticks = [_tick(t0, 1.0, "instant,samples", busy=0.6), _tick(t0 + 1, 0.5, "samples", busy=0.3),
                     *(_tick(t0 + k, 0.0, "samples", busy=0.6) for k in range(2, 5))]  # fmt: skip
        else:
            ticks = [_tick(t0 + k, 0.0, "samples", busy=0.6) for k in range(5)]
        iv = merge_gpu_ticks(UUID, i, ticks)
        if not exact:
            iv.util_unmeasured_s = None
        ivs.append(iv)
    led.append(RUN, gpu=ivs)
    return run_


def test_gpuledger_show_counts_the_unmeasured_time_of_a_run_that_also_had_measured_lost_time(
    ledger_url: str,
) -> None:
    # Before the exact column, the run's totals merged every interval's method into
    # "instant,samples" and called all 9 s of unknown time measured: 0 s unmeasured, 3.5 s idle.
    with Ledger(ledger_url) as led:
        run_ = _run_with_mixed_intervals(led, exact=True)
        g = summary(led, run_)["gpus"][0]
    assert g["util_unknown_seconds"] == pytest.approx(2 + 2 + 1.5 + 1.5 + 1.5)
    assert g["unmeasured_seconds"] == pytest.approx(1.5 + 1.5 + 0.5)
    assert g["idle_seconds"] == pytest.approx(50 - 3.5 - g["busy_seconds"])
    out = CliRunner().invoke(cli, ["show", RUN, "--db", ledger_url, "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["gpus"][0]["unmeasured_seconds"] == pytest.approx(3.5)


def test_intervals_stored_before_the_exact_column_are_judged_one_by_one(ledger_url: str) -> None:
    with Ledger(ledger_url) as led:
        run_ = _run_with_mixed_intervals(led, exact=False)
        g = summary(led, run_)["gpus"][0]
    # intervals 6 and 7 by their own method; interval 8 reads "instant,samples": counted measured
    assert g["unmeasured_seconds"] == pytest.approx(1.5 + 1.5)


@pytest.mark.parametrize(
    ("exact", "expected"),
    [
        (True, [0, 0, 0, 0, 0, 0, 1.5, 1.5, 0.5, 0]),  # each interval's exact figure
        (False, [0, 0, 0, 0, 0, 0, 1.5, 1.5, 0, 0]),  # stored before the column: its own method
    ],
)
def test_the_export_carries_each_intervals_unmeasured_time_the_same_both_ways(
    ledger_url: str, exact: bool, expected: list[float]
) -> None:
    with Ledger(ledger_url) as led:
        _run_with_mixed_intervals(led, exact=exact)
        streamed = io.StringIO()
        write_csv(stream_rows(led, RUN), streamed)
        gathered = to_csv(interval_rows(RUN, led.devices(RUN), led.gpu_intervals(RUN), []))
    assert streamed.getvalue() == gathered
    rows = list(csv.DictReader(io.StringIO(gathered)))
    assert [float(r["util_unmeasured_s"]) for r in rows] == pytest.approx(expected)


def test_migration_12_adds_the_column_and_keeps_older_rows_judged_by_their_method(ledger_url: str) -> None:
    from gpuledger.store.engine import Database

    with Ledger(ledger_url) as led:
        run_ = _run_with_mixed_intervals(led, exact=False)
    db = Database(ledger_url)
    try:  # back to what version 11 made
        db.write(lambda c: c.execute(sa.text("ALTER TABLE gpu_intervals DROP COLUMN util_unmeasured_s")))
        db.write(lambda c: c.execute(sa.delete(schema.schema_version).where(schema.schema_version.c.version >= 12)))
    finally:
        db.close()
    with Ledger(ledger_url) as led:
        assert led.schema_version() == LATEST
        assert [iv.util_unmeasured_s for iv in led.gpu_intervals(RUN)] == [None] * 10
        assert summary(led, run_)["gpus"][0]["unmeasured_seconds"] == pytest.approx(3.0)
