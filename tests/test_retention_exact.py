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

import datetime as dt
import json
import math
from collections.abc import Iterator, Sequence
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_support import card, price_change, ts
from gpuledger.cli.main import cli
from gpuledger.core.metering.rollup import rollup_gpu, rollup_host
from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, RunRecord
from gpuledger.core.pricing.ratecard import RateCard
from gpuledger.reports.cost.costing import chargeback, load_rate_card, month_window, run_costs
from gpuledger.reports.cost.rollups import materialise_rollups
from gpuledger.reports.run import epochs as epochs_report
from gpuledger.runs.view import summary
from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, audit, schema
from gpuledger.store.audit_approve import approve
from gpuledger.store.retention import DAY_S, Policy, Report, run_retention
from server_support import NOW, bearer, setup_accounts

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


# -- F1: a price change inside a merged interval ----------------------------------------------------


def _busy_then_idle(t0: float) -> list[GpuInterval]:
    """One A100 for an hour in 5 s intervals: fully busy the first half hour, idle the second."""
    return [GpuInterval("GPU-1", i, t0 + 5 * i, t0 + 5 * i + 5, busy_s=5.0 if i < 360 else 0.0, energy_j=1500.0)
            for i in range(720)]  # fmt: skip


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_price_change_inside_an_hour_is_billed_the_same_after_retention_run(ledger_url: str, tmp_path: Path) -> None:
    """3.00/h until 21:30, 1.00/h after; busy 21:00-21:30 only: 0.5 busy GPU-h x 3.00 = 1.50, read
    before and after `gpuledger retention run --rates` rolled the hour up (before: 1.00)."""
    t0 = math.floor(NOW / DAY_S) * DAY_S - 30 * DAY_S + 21 * 3600  # 21:00, 30 days ago: 1-hour intervals
    rid = "0190aaaa-0000-7000-8000-000000000001"
    with Ledger(ledger_url) as led:
        _add_run(led, rid, t0, t0 + 3600, gpu=_busy_then_idle(t0))
    rates = tmp_path / "card.toml"
    change = _iso(t0 + 1800)
    rates.write_text(
        '[card]\ncurrency = "USD"\nbasis = "busy"\n\n'
        f'[[gpu]]\nmodel = "A100-40GB-SXM"\nprice_per_hour = "3.00"\neffective_to = {change}\n\n'
        f'[[gpu]]\nmodel = "A100-40GB-SXM"\nprice_per_hour = "1.00"\neffective_from = {change}\n'
    )
    env = {"GPULEDGER_RATES": "", "GPULEDGER_HOME": str(tmp_path / "home")}

    def cost() -> str:
        out = CliRunner().invoke(cli, ["cost", rid, "--db", ledger_url, "--rates", str(rates), "--json"], env=env)
        assert out.exit_code == 0, out.output
        return json.loads(out.output)["total"]["cost"]

    assert cost() == "1.50"
    args = ["retention", "run", "--db", ledger_url, "--raw-days", "7", "--minute-days", "10", "--keep-logs",
            "--keep-capacity", "--rates", str(rates)]  # fmt: skip
    out = CliRunner().invoke(cli, args, env=env)
    assert out.exit_code == 0, out.output
    assert "1 runs to 60 s, 1 runs to 3600 s" in out.output
    assert cost() == "1.50"
    with Ledger(ledger_url) as led:
        assert [(iv.t0 - t0, iv.t1 - t0, iv.busy_s) for iv in led.gpu_intervals(rid)] == [
            (0.0, 1800.0, 1800.0),
            (1800.0, 3600.0, 0.0),
        ]
        day = math.floor(t0 / DAY_S) * DAY_S
        cb = chargeback(led, scope=None, card=load_rate_card(rates), start=day, end=day + DAY_S, by=("team",),
                        trend_months=0)  # fmt: skip
        assert cb.total["cost"] == "1.50"
        assert audit.verify(led).ok


def test_retention_refuses_a_broken_rate_card_before_rewriting_anything(ledger_url: str, tmp_path: Path) -> None:
    t0 = math.floor(NOW / DAY_S) * DAY_S - 30 * DAY_S
    with Ledger(ledger_url) as led:
        _add_run(led, "0190aaaa-0000-7000-8000-000000000002", t0, t0 + 3600, gpu=_busy_then_idle(t0))
    broken = tmp_path / "card.toml"
    broken.write_text('[card]\ncurrency = "USD"\nbasis = "busy"\n[[gpu]]\nmodel = "A100"\nprice_per_hour = "x"\n')
    env = {"GPULEDGER_RATES": str(broken), "GPULEDGER_HOME": str(tmp_path / "home")}
    out = CliRunner().invoke(cli, ["retention", "run", "--db", ledger_url], env=env)
    assert out.exit_code == 1 and "the rate card has problems" in out.output and "Traceback" not in out.output
    with Ledger(ledger_url) as led:
        assert len(led.gpu_intervals("0190aaaa-0000-7000-8000-000000000002")) == 720


def test_a_price_change_at_midnight_inside_an_interval_is_billed_the_same(led: Ledger) -> None:
    """60 s intervals from 23:00:30; busy only in the one crossing midnight, where 3.00/h becomes
    1.00/h: 30 s x 3.00 + 30 s x 1.00 = 0.0333 (after 1-hour retention before: 0.0497)."""
    c = price_change("A100-40GB-SXM", "2026-04-01T00:00:00", "3.00", "1.00")
    t0 = ts("2026-03-31T23:00:30")
    gpu = [GpuInterval("GPU-1", i, t0 + 60 * i, t0 + 60 * i + 60, busy_s=60.0 if i == 59 else 0.0) for i in range(90)]
    _add_run(led, "r1", t0, t0 + 5400, gpu=gpu)
    before = run_costs(led, ["r1"], scope=None, card=c)["total"]["cost"]
    assert _near(before, "0.033333")
    _retain(led, t0 + 10 * DAY_S, HOUR, c)
    assert run_costs(led, ["r1"], scope=None, card=c)["total"]["cost"] == before


def test_a_midnight_inside_an_hour_keeps_each_months_bill(led: Ledger) -> None:
    """A flat card, busy only in the 60 s interval crossing 31 March / 1 April midnight: March
    holds 30 busy seconds (0.0208 at 2.50/h), also when the rollups are rebuilt from the 1-hour
    intervals retention left (before: 59.99 s of the merged hour went to March)."""
    t0 = ts("2026-03-31T23:00:30")
    gpu = [GpuInterval("GPU-1", i, t0 + 60 * i, t0 + 60 * i + 60, busy_s=60.0 if i == 59 else 0.0) for i in range(90)]
    _add_run(led, "r1", t0, t0 + 5400, gpu=gpu)
    march = month_window("2026-03")
    cb = chargeback(led, scope=None, card=FLAT, start=march[0], end=march[1], by=("team",), trend_months=0)
    assert _near(cb.total["cost"], "0.020833") and _near(cb.total["busy_gpu_h"], "0.008333")
    _retain(led, t0 + 10 * DAY_S, HOUR)
    materialise_rollups(led, rebuild=True)  # `gpuledger report rollup --rebuild`: from the 1-hour intervals
    after = chargeback(led, scope=None, card=FLAT, start=march[0], end=march[1], by=("team",), trend_months=0)
    assert (after.total["cost"], after.total["busy_gpu_h"]) == (cb.total["cost"], cb.total["busy_gpu_h"])


# -- F2: a GPU shared by two runs ------------------------------------------------------------------


def _shared(led: Ledger, b_start: float) -> float:
    """Run a holds GPU-S 18:00-19:00, run b from ``b_start`` (seconds after 18:00) to 19:00. Alone,
    a leaves it idle; together it is fully busy, b with 90 % of the SM, a with 10 %."""
    t0 = ts("2026-03-10T18:00")
    n = int(b_start // 5)
    ga = [GpuInterval("GPU-S", i, t0 + 5 * i, t0 + 5 * i + 5, busy_s=0.0 if i < n else 5.0, energy_j=500.0,
                      proc_sm_util_avg_pct=0.0 if i < n else 10.0) for i in range(720)]  # fmt: skip
    gb = [GpuInterval("GPU-S", i, t0 + b_start + 5 * i, t0 + b_start + 5 * i + 5, busy_s=5.0, energy_j=500.0,
                      proc_sm_util_avg_pct=90.0) for i in range(int((3600 - b_start) // 5))]  # fmt: skip
    _add_run(led, "a", t0, t0 + 3600, "GPU-S", ga)
    _add_run(led, "b", t0 + b_start, t0 + 3600, "GPU-S", gb)
    return t0


def _per_run(led: Ledger) -> dict[str, str]:
    return {r["run_id"]: r["total"]["cost"] for r in run_costs(led, ["a", "b"], scope=None, card=FLAT)["runs"]}


@pytest.mark.parametrize(
    ("b_start", "policy", "a", "b", "total"),
    [
        # 0.5 busy GPU-h at 2.50/h, a 10 % of it, b 90 % (after 1-hour retention before: 1.5625)
        (1800.0, HOUR, "0.125", "1.125", "1.25"),
        # b from 18:30:30: 29.5 busy minutes (after 1-minute retention before: 1.234375)
        (1830.0, MINUTE, "0.1229175", "1.10625", "1.2291675"),
    ],
    ids=["hour", "minute"],
)
def test_a_shared_gpu_is_split_the_same_after_retention(
    led: Ledger, b_start: float, policy: Policy, a: str, b: str, total: str
) -> None:
    t0 = _shared(led, b_start)
    window = month_window("2026-03")
    assert _per_run(led) == {"a": a, "b": b} and _bill(led, ["a", "b"], FLAT, window) == (total, total)
    _retain(led, t0 + 10 * DAY_S, policy)
    assert _per_run(led) == {"a": a, "b": b} and _bill(led, ["a", "b"], FLAT, window) == (total, total)
    materialise_rollups(led, rebuild=True)  # rollups rebuilt from the intervals retention left
    assert _bill(led, ["a", "b"], FLAT, window) == (total, total)
    assert audit.verify(led).ok


def _gpu_rollups(led: Ledger) -> list[tuple]:  # type: ignore[type-arg]
    r = schema.gpu_rollups.c
    return led.read(lambda c: sorted(tuple(x) for x in c.execute(sa.select(r.run_id, r.day, r.busy_s, r.alloc_s))))


def test_a_fully_dropped_late_replay_keeps_the_rollups_of_a_shared_gpu(ledger_url: str) -> None:
    """Team ledger: run A's raw batch, replayed by its agent after retention, is dropped row by row
    (rollup_marks); it carries A's devices unchanged, which must not drop A's cost rollups either
    (before: dropped, then re-derived from coarse intervals, 1.25 -> 1.7993)."""
    tokens = setup_accounts(ledger_url)
    t0 = math.floor((NOW - 20 * DAY_S) / DAY_S) * DAY_S + 18 * 3600  # 18:00 UTC, 20 days ago
    dev = [{"index": 0, "uuid": "GPU-0", "name": A100, "memory_total_b": 40 * 2**30}]

    def body(rid: str, start: float, n: int, first_busy: int, sm: float) -> dict:  # type: ignore[type-arg]
        rows = [{"device_uuid": "GPU-0", "seq": i, "t0": start + 5 * i, "t1": start + 5 * i + 5, "samples": 5,
                 "busy_s": 0.0 if i < first_busy else 5.0, "util_method": "samples", "energy_j": 500.0,
                 "energy_method": "counter", "proc_sm_util_avg_pct": 0.0 if i < first_busy else sm,
                 "proc_mem_max_b": 2**30} for i in range(n)]  # fmt: skip
        run = {"id": rid, "command": ["train"], "user": "ana", "host": "gpu-node-1", "cwd": "/", "started_at": start,
               "status": "succeeded", "ended_at": start + 5 * n, "exit_code": 0,
               "labels": {"team": "vision", "project": "A"}}  # fmt: skip
        return {"run": run, "devices": dev, "gpu_intervals": rows, "host_intervals": [], "events": [],
                "metrics": [], "final": True}  # fmt: skip

    a, b = "0190aaaa-0000-7000-8000-00000000000a", "0190aaaa-0000-7000-8000-00000000000b"
    ba, bb = body(a, t0, 720, 360, 10.0), body(b, t0 + 1800, 360, 0, 90.0)
    day = math.floor(t0 / DAY_S) * DAY_S
    open_months = 62  # a month ago, pushed now: no month may have closed (store/closed_months.py)
    settings = Settings(close_after_days=open_months)
    with TestClient(create_app(ledger_url, settings=settings)) as client, Ledger(ledger_url) as led:
        for doc in (ba, bb):
            assert client.post("/api/v1/ingest", json=doc, headers=bearer(tokens.agent_a)).status_code == 200
        assert _bill(led, [a, b], FLAT, (day, day + DAY_S)) == ("1.25", "1.25")
        run_retention(led, HOUR, actor="admin", now=NOW, cost_rollups=materialise_rollups)
        assert _bill(led, [a, b], FLAT, (day, day + DAY_S)) == ("1.25", "1.25")
        rollups = _gpu_rollups(led)
        assert {r[0] for r in rollups} == {a, b}
        again = client.post("/api/v1/ingest", json=ba, headers=bearer(tokens.agent_a)).json()
        assert (again["gpu_intervals"], again["dropped_rolled_up"]) == (0, 720)
        assert _gpu_rollups(led) == rollups  # nothing a rollup summed changed: the rollups stand
        assert _bill(led, [a, b], FLAT, (day, day + DAY_S)) == ("1.25", "1.25")
        assert audit.verify(led, close_after_days=open_months).ok


def test_devices_added_again_unchanged_keep_the_rollups(led: Ledger) -> None:
    t0 = _shared(led, 1800.0)
    _retain(led, t0 + 10 * DAY_S, HOUR)
    rollups = _gpu_rollups(led)
    assert {r[0] for r in rollups} == {"a", "b"}
    led.add_devices("a", [GpuIdentity(0, "GPU-S", A100)])  # a replay (gpuledger recover) sends them again
    assert _gpu_rollups(led) == rollups
    led.add_devices("a", [GpuIdentity(0, "GPU-S", "NVIDIA H100 80GB HBM3")])  # a changed GPU: stale
    assert {r[0] for r in _gpu_rollups(led)} == {"b"}


# -- F3: an epoch boundary inside an interval ------------------------------------------------------


def test_epoch_boundaries_inside_intervals_keep_the_per_epoch_figures(led: Ledger) -> None:
    """5 s intervals for 20 minutes, busy (and CPU) 1 s/s from 62.5 s to 602.5 s, epochs 62.5-302.5
    and 302.5-602.5 s: boundaries 2.5 s inside an interval, which the report splits by time, giving
    busy 1.25 / 238.75 / 298.75 / 1.25 s (after 1-hour retention before: 28.125 / 108 / 135 / 268.875)."""
    t0 = ts("2026-03-10T18:00")

    def busy(i: int) -> float:
        return max(0.0, min(5 * i + 5, 602.5) - max(5 * i, 62.5))

    gpu = [GpuInterval("GPU-1", i, t0 + 5 * i, t0 + 5 * i + 5, busy_s=busy(i), energy_j=100.0 + 200.0 * busy(i))
           for i in range(240)]  # fmt: skip
    host = [HostInterval(i, t0 + 5 * i, t0 + 5 * i + 5, samples=5, cpu_s=busy(i), rss_max_b=2**30) for i in range(240)]
    events = [Event(t0 + a, kind, payload={"epoch": epoch})
              for a, kind, epoch in ((62.5, "epoch_start", 1), (302.5, "epoch_end", 1), (302.5, "epoch_start", 2),
                                     (602.5, "epoch_end", 2))]  # fmt: skip
    _add_run(led, "r1", t0, t0 + 1200, gpu=gpu, host=host, events=events)

    def table() -> list[tuple]:  # type: ignore[type-arg]
        return [(r["phase"], r["epoch"], round(r["gpu_busy_s"], 9), round(r["gpu_energy_j"], 6), round(r["cpu_s"], 9))
                for r in epochs_report.epoch_table(led, led.get_run("r1"))]  # fmt: skip

    expected = [("setup", None, 1.25, 1500.0, 1.25), ("epoch", 1, 238.75, 52550.0, 238.75),
                ("epoch", 2, 298.75, 65750.0, 298.75), ("after training", None, 1.25, 12200.0, 1.25)]  # fmt: skip
    assert table() == expected
    _retain(led, t0 + 10 * DAY_S, MINUTE)
    assert table() == expected
    _retain(led, t0 + 10 * DAY_S, HOUR)
    assert table() == expected
    assert len(led.gpu_intervals("r1")) < 20  # rolled up all the same


# -- F4: a local replay into a rolled-up run --------------------------------------------------------


def test_ledger_append_drops_raw_rows_a_rollup_replaced(led: Ledger) -> None:
    """An hour of 5 s intervals, busy 2 s and 1 CPU-s each: 1440 busy s, 720 CPU-s, 1.00 at 2.50/h;
    the same raw rows appended again after retention (gpuledger recover) add nothing (before: 2760 s)."""
    t0 = ts("2026-03-10T18:00")
    gpu = [GpuInterval("GPU-1", i, t0 + 5 * i, t0 + 5 * i + 5, busy_s=2.0, energy_j=100.0) for i in range(720)]
    host = [HostInterval(i, t0 + 5 * i, t0 + 5 * i + 5, samples=5, cpu_s=1.0, rss_max_b=1) for i in range(720)]
    _add_run(led, "r1", t0, t0 + 3600, gpu=gpu, host=host)
    _retain(led, t0 + 10 * DAY_S, MINUTE)
    led.append("r1", gpu=gpu, host=host)
    s = summary(led, led.get_run("r1"), now=t0 + 3601)
    assert (s["gpus"][0]["busy_seconds"], s["cpu_seconds"]) == (1440.0, 720.0)
    assert run_costs(led, ["r1"], scope=None, card=FLAT)["total"]["cost"] == "1.00"
    assert audit.verify(led).ok
    later = GpuInterval("GPU-1", 720, t0 + 3600, t0 + 3605, busy_s=1.0)  # a row past the mark still counts
    led.append("r1", gpu=[later])
    assert summary(led, led.get_run("r1"), now=t0 + 3601)["gpus"][0]["busy_seconds"] == 1441.0


# -- F6: a run without intervals --------------------------------------------------------------------


def test_a_run_without_intervals_is_not_rolled_up_every_day(led: Ledger) -> None:
    t0 = ts("2026-03-10T18:00")
    _add_run(led, "empty", t0, t0 + 3, status="failed")
    log = schema.audit_log.c

    def entries() -> int:
        return led.read(lambda c: c.scalar(sa.select(sa.func.count()).where(log.object == "run:empty")))

    first = entries()
    for day in range(3):
        assert _retain(led, t0 + (10 + day) * DAY_S, HOUR).rolled_up == {}
    assert entries() == first and audit.verify(led).ok


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
