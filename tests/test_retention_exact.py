"""Retention keeps every figure: what an audit of `gpuledger retention` found changed, each with
its hand-computed figure, on SQLite and PostgreSQL, and a property: no rolled-up interval straddles
an instant where reports cut figures by time, so splitting by time gives what the raw rows gave.

- F1: a price change (or a UTC midnight) inside a merged interval moved busy time across it;
- F2: a GPU shared by two runs was split differently from coarse intervals, and a fully dropped
  late replay still dropped the runs' cost rollups;
- F3: an epoch boundary inside an interval moved per-epoch figures;
- F4: Ledger.append added raw rows a rollup had already replaced;
- F6: a run without intervals was rolled up (audited, resealed) again on every retention run.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_support import card
from gpuledger.core.metering.rollup import rollup_gpu, rollup_host
from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, RunRecord
from gpuledger.core.pricing.ratecard import RateCard
from gpuledger.reports.cost.costing import chargeback, run_costs
from gpuledger.reports.cost.rollups import materialise_rollups
from gpuledger.store import Ledger
from gpuledger.store.audit_approve import approve
from gpuledger.store.retention import DAY_S, Policy, Report, run_retention

A100 = "NVIDIA A100-SXM4-40GB"
FLAT = card('[[gpu]]\nmodel = "A100-40GB-SXM"\nprice_per_hour = "2.50"\n')
MINUTE = Policy(raw_days=1, minute_days=30, log_days=None, capacity_days=None)  # 1-minute intervals
HOUR = Policy(raw_days=1, minute_days=2, log_days=None, capacity_days=None)  # then 1-hour ones


@pytest.fixture
def led(ledger_url: str) -> Iterator[Ledger]:
    with Ledger(ledger_url) as ledger:
        yield ledger


def _add_run(
    led: Ledger, rid: str, t0: float, t1: float, uuid: str = "GPU-1", gpu: Sequence[GpuInterval] = (),
    host: Sequence[HostInterval] = (), events: Sequence[Event] = (), status: str = "succeeded",
) -> None:  # fmt: skip
    led.create_run(RunRecord(id=rid, command=["train"], user="ana", host="h", cwd="/", started_at=t0,
                             status="running", labels={"team": "vision", "project": "det"}))  # fmt: skip
    led.add_devices(rid, [GpuIdentity(0, uuid, A100)])
    led.append(rid, gpu=list(gpu), host=list(host), events=list(events))
    led.update_run(rid, status=status, ended_at=t1)
    approve(led, actor="test", adopt=[rid])  # sealed: retention rewrites only what the trail vouches for


def _retain(led: Ledger, now: float, policy: Policy, c: RateCard | None = None) -> Report:
    changes = c.change_points if c is not None else ()
    report = run_retention(led, policy, actor="test", now=now, cost_rollups=materialise_rollups, price_changes=changes)
    assert not report.skipped, report.skipped
    return report


def _near(value: str | float, expected: str) -> bool:
    return abs(Decimal(str(value)) - Decimal(expected)) <= Decimal("0.00001")


def _bill(led: Ledger, ids: list[str], c: RateCard, window: tuple[float, float]) -> tuple[str, str]:
    """(gpuledger cost's total, the chargeback's total) over ``window``."""
    cost = run_costs(led, ids, scope=None, card=c)["total"]["cost"]
    cb = chargeback(led, scope=None, card=c, start=window[0], end=window[1], by=("team",), trend_months=0)
    return cost, cb.total["cost"]


# -- the property --------------------------------------------------------------------------------

MIDNIGHT = 20_000 * DAY_S  # intervals start around this UTC midnight


def _before(ivs: Sequence[GpuInterval | HostInterval], c: float, field: str) -> float:
    """The sum of ``field`` before instant ``c``, splitting an interval in proportion to time."""
    return math.fsum(
        getattr(iv, field) * min(1.0, max(0.0, (c - iv.t0) / (iv.t1 - iv.t0))) for iv in ivs if getattr(iv, field)
    )


@st.composite
def _case(draw: st.DrawFn) -> tuple[list[GpuInterval], list[HostInterval], list[float], list[tuple[float, float]]]:
    n = draw(st.integers(1, 80))
    t = MIDNIGHT - draw(st.floats(0, 7200))
    gpu, host = [], []
    for seq in range(n):
        t0 = t + draw(st.sampled_from([0.0, 0.0, 0.0, 0.25, 1.0, 1.5, 40.0]))  # contiguous, small gaps, holes
        t1 = t0 + draw(st.sampled_from([5.0, 5.0, 60.0, 0.5])) + draw(st.floats(0, 90))
        busy = draw(st.floats(0, 1)) * (t1 - t0)
        gpu.append(GpuInterval("g", seq, t0, t1, busy_s=busy, energy_j=draw(st.floats(0, 400)) * (t1 - t0)))
        host.append(HostInterval(seq, t0, t1, samples=1, cpu_s=draw(st.floats(0, 8)) * (t1 - t0), rss_max_b=1))
        t = t1
    lo, hi = gpu[0].t0, gpu[-1].t1
    edges = [iv.t0 for iv in gpu] + [iv.t1 for iv in gpu]
    anywhere = st.floats(lo - 10, hi + 10)
    # epoch boundaries and price changes: on interval edges, anywhere (inside intervals, in gaps)
    cuts = draw(st.lists(st.one_of(st.sampled_from(edges), anywhere), max_size=8))
    cuts += [d * DAY_S for d in range(math.floor(lo / DAY_S) + 1, math.ceil(hi / DAY_S))]  # UTC midnights
    keep = draw(st.lists(st.tuples(anywhere, st.floats(1, 600)).map(lambda p: (p[0], p[0] + p[1])), max_size=2))
    return gpu, host, cuts, keep


@settings(max_examples=300, deadline=None)
@given(_case(), st.sampled_from([60, 3600]))
def test_splitting_by_time_at_any_cut_gives_what_the_raw_intervals_gave(case, level_s: int) -> None:  # type: ignore[no-untyped-def]
    gpu, host, cuts, keep = case
    rolled_gpu = rollup_gpu(gpu, level_s, cuts, keep)
    rolled_host = rollup_host(host, level_s, cuts)
    raw_ids = {id(iv) for iv in gpu}
    for c in cuts:
        for raw, rolled, field in ((gpu, rolled_gpu, "busy_s"), (gpu, rolled_gpu, "energy_j"),
                                   (host, rolled_host, "cpu_s")):  # fmt: skip
            total = math.fsum(getattr(iv, field) for iv in raw)
            want, got = _before(raw, c, field), _before(rolled, c, field)
            assert math.isclose(want, got, rel_tol=1e-6, abs_tol=1e-6 * max(total, 1.0)), (c, field, want, got)
    for iv in rolled_gpu:  # a merged interval holds no cut inside and meets no kept span
        if id(iv) not in raw_ids:
            assert not any(iv.t0 < c < iv.t1 for c in cuts), iv
            assert not any(iv.t0 < b and a < iv.t1 for a, b in keep), iv
