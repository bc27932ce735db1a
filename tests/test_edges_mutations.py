"""Edges no other test reached (issue 34): each test states the documented rule and computes what
it must give on its own, so that removing the rule from the code turns it red.

* core/metering/busy.py: the sample period is learned from busy-to-busy spacings only, and never grows.
* core/pricing: unmeasured hours are not idle; a rate line's validity is [from, to).
* reports/capacity/report.py: ``--share-idle`` splits by allocated, or busy + unmeasured, hours.
* node/docker_inspect.py: ``all`` anywhere in NVIDIA_VISIBLE_DEVICES selects every GPU.
* agent/outbox.py: ``final`` only on the batch that leaves nothing behind.
"""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner

from cost_support import H, card, ts, usage
from gpuledger.agent.outbox import build_batch
from gpuledger.cli.main import cli
from gpuledger.core.capacity.model import DAY_MS, CapacityInterval, Sighting, States
from gpuledger.core.metering.busy import PERIOD_MIN_S, SamplePeriod, busy_from_samples
from gpuledger.core.model import GpuIdentity, GpuInterval, HostInterval, RunRecord
from gpuledger.core.money import money_decimal
from gpuledger.core.pricing.cost import Pricer
from gpuledger.node.docker_inspect import gpus_from_env
from gpuledger.store import Ledger, pushes
from gpuledger.store.capacity import write_capacity

US = 1_000_000


# -- the sample period (NVML: one sample per period while the GPU works, fewer or none while idle) --


def test_an_idle_to_busy_spacing_teaches_no_period() -> None:
    # An idle GPU whose driver samples every 0.5 s at 0 %, then one busy sample. The 0.5 s between
    # the last idle sample and the busy one is no sample period (the driver slows down while idle):
    # the period stays the shortest documented one, so the lone busy sample after an idle gap is
    # billed 1/6 s, not 0.55 s.
    idle = [(k * 500_000, 0.0) for k in range(5)]
    busy_at = idle[-1][0] + 500_000
    period = SamplePeriod()
    period.observe([*idle, (busy_at, 100.0)])
    assert not period.learned and period.seconds == PERIOD_MIN_S
    lone = busy_from_samples([(busy_at + 2 * US, 100.0)], busy_at, period.seconds)
    assert lone.busy_s == pytest.approx(1 / 6)
    assert lone.idle_s == pytest.approx(2 - 1 / 6)


def test_the_learned_period_never_grows_when_a_short_spacing_ages_out() -> None:
    # The documented rule: the period "only ever decreases" (one burst of slow sampling must not
    # stretch every later sample). History: one 0.20 s spacing, fourteen 0.28 s and seventeen
    # 0.40 s ones (32, the history's length). Regular sampling is the cluster up to 1.5 x the
    # smallest (0.30 s): its median 0.28 s, widened 10 %: 0.308 s.
    spacings = [0.20] + [0.28] * 14 + [0.40] * 17
    samples, t = [(0, 100.0)], 0
    for s in spacings:
        t += round(s * US)
        samples.append((t, 100.0))
    period = SamplePeriod()
    period.observe(samples)
    assert period.learned and period.seconds == pytest.approx(0.308)
    # A 0.27 s spacing pushes the 0.20 s one out of the history: the cluster up to 1.5 x 0.27 s
    # now takes in the 0.40 s spacings and its median is 0.40 s. The period must stay 0.308 s.
    period.observe([(t + 270_000, 100.0)], previous=(t, 100.0))
    assert period.seconds == pytest.approx(0.308)


# -- pricing: unmeasured is not idle; a line's `to` is exclusive (docs/CHARGEBACK.md, RATE_CARDS.md) --

H100 = '[[gpu]]\nmodel = "H100-SXM"\nprice_per_hour = "4.00"\n'


def test_unmeasured_hours_cost_no_idle() -> None:
    # docs/CHARGEBACK.md: idle = allocated - busy - unmeasured; idle_cost = idle hours x rate.
    pricer = Pricer(card(H100, basis="allocated"))
    name = "NVIDIA H100 80GB HBM3"
    [unmeasured] = pricer.price(usage(ts("2026-03-10"), 10, util=None, name=name, watts=None))
    assert unmeasured.unmeasured_uh == 10 * US and unmeasured.idle_uh == 0
    assert money_decimal(unmeasured.idle_cost) == 0
    assert money_decimal(unmeasured.cost) == Decimal("40.00")  # billed as held on the allocated basis
    [measured] = pricer.price(usage(ts("2026-03-10"), 10, util=0.25, name=name, watts=None))
    assert money_decimal(measured.idle_cost) == Decimal("7.5") * Decimal("4.00")


def test_a_price_line_does_not_apply_at_its_own_end() -> None:
    # effective_to is exclusive: at that instant (and after, with no later line) nothing prices it.
    rates = card(f"{H100}effective_to = 2026-03-10T12:00:00\n", basis="allocated")
    end = ts("2026-03-10T12:00")
    assert rates.line_at("H100-SXM", None, end - 1) is not None
    assert rates.line_at("H100-SXM", None, end) is None
    pricer = Pricer(rates)
    name = "NVIDIA H100 80GB HBM3"
    lines = pricer.price(usage(end - 2 * H, 4, util=None, name=name, watts=None))
    priced = sum(ln.alloc_uh for ln in lines if ln.line is not None)
    unpriced = sum(ln.unpriced_uh for ln in lines)
    assert (priced, unpriced) == (2 * US, 2 * US)  # two hours before the end, two after
    assert sum(money_decimal(ln.cost) for ln in lines) == Decimal("8.00")
    [after] = pricer.price(usage(end, 1, util=None, name=name, watts=None))  # starts at the end
    assert after.line is None and "unpriced" in after.flags and after.cost == 0


# -- --share-idle: the weights, computed here from the documented rule (docs/CAPACITY.md) ----------

MARCH = ts("2026-03-01")
RUN_T0 = ts("2026-03-10")
HOURS = 10


@pytest.fixture
def two_teams(tmp_path: Path) -> str:
    """Two H100s for March. Team a held one 10 h and kept it busy 2 h; team b held the other 10 h
    on a GPU that reports no utilisation (busy unmeasured)."""
    url = f"sqlite:///{tmp_path}/l.db"
    t0 = int(MARCH * 1000)
    ivs = [
        CapacityInterval(gpu, "gpu-1", t0 + d * DAY_MS, t0 + (d + 1) * DAY_MS, States(DAY_MS, 0, 0, 0))
        for d in range(31)
        for gpu in ("GPU-a", "GPU-b")
    ]
    sights = [Sighting(u, "NVIDIA H100 80GB HBM3", "gpu-1", MARCH, MARCH + 31 * 86400) for u in ("GPU-a", "GPU-b")]
    with Ledger(url) as led:
        led.write(lambda c: write_capacity(led.database, c, ivs, sights))
        for team, gpu, busy_per_hour in (("a", "GPU-a", 0.2 * H), ("b", "GPU-b", None)):
            run_id = str(uuid.uuid4())
            end = RUN_T0 + HOURS * H
            led.create_run(RunRecord(id=run_id, command=["train"], user="u", host="gpu-1", cwd="/",
                                     started_at=RUN_T0, ended_at=end, status="succeeded",
                                     labels={"team": team}))  # fmt: skip
            led.add_devices(run_id, [GpuIdentity(0, gpu, "NVIDIA H100 80GB HBM3")])
            led.append(run_id, [GpuInterval(gpu, k, RUN_T0 + k * H, RUN_T0 + (k + 1) * H, busy_s=busy_per_hour)
                                for k in range(HOURS)])  # fmt: skip
    return url


def _chargeback(url: str, *extra: str) -> dict:
    args = ["report", "chargeback", "--db", url, "--month", "2026-03", "--basis", "busy", "--json", *extra]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_the_chargeback_counts_unmeasured_hours_as_neither_idle_nor_busy(two_teams: str) -> None:
    groups = {g["team"]: g for g in _chargeback(two_teams)["groups"]}
    a, b = groups["a"], groups["b"]
    assert (a["allocated_gpu_h"], a["busy_gpu_h"], a["unmeasured_gpu_h"], a["idle_gpu_h"]) == (10, 2, 0, 8)
    assert (b["allocated_gpu_h"], b["busy_gpu_h"], b["unmeasured_gpu_h"], b["idle_gpu_h"]) == (10, 0, 10, 0)
    rate = Decimal(a["cost"]) / 2  # busy basis: team a is billed its 2 busy hours
    assert Decimal(a["idle_cost"]) == 8 * rate
    assert Decimal(b["idle_cost"]) == 0  # held hours with no utilisation reading are not idle
    assert Decimal(b["cost"]) == 10 * rate  # billed as busy (docs/RATE_CARDS.md)


@pytest.mark.parametrize(
    ("rule", "weights"),
    [
        ("allocated", {"a": 10, "b": 10}),  # held hours
        ("busy", {"a": 2, "b": 10}),  # busy hours, and the held hours of the GPU that reports none
    ],
)
def test_shared_idle_is_split_by_the_rules_own_hours(two_teams: str, rule: str, weights: dict[str, int]) -> None:
    data = _chargeback(two_teams, "--share-idle", rule)
    pool = Decimal(data["fleet_cost"]) - Decimal(data["total"]["cost"])
    assert pool > 0
    groups = {g["team"]: g for g in data["groups"]}
    for team, weight in weights.items():
        expected = pool * weight / sum(weights.values())
        assert abs(Decimal(groups[team]["shared_idle_cost"]) - expected) < Decimal("0.000001"), (team, rule)
    assert sum(Decimal(g["shared_idle_cost"]) for g in groups.values()) == pool


# -- NVIDIA_VISIBLE_DEVICES: libnvidia-container's select_devices takes "all" anywhere in the list --


@pytest.mark.parametrize("value", ["0,all", "GPU-1, ALL", "all,1", " 2 , All "])
def test_all_anywhere_in_the_list_is_every_gpu(value: str) -> None:
    assert gpus_from_env([f"NVIDIA_VISIBLE_DEVICES={value}"]) == ("all",)


# -- the outbox: "final" seals the run on the server, so it goes with the last rows only ----------


def _ended_run(led: Ledger, n: int) -> str:
    run_id = str(uuid.uuid4())
    start = ts("2026-03-10")
    led.create_run(RunRecord(run_id, ["python", "t.py"], "u", "h", "/", start))
    led.add_devices(run_id, [GpuIdentity(0, "GPU-0", "NVIDIA A100-SXM4-80GB")])
    led.append(
        run_id,
        [GpuInterval("GPU-0", i, start + 5 * i, start + 5 * i + 5, busy_s=2.5) for i in range(n)],
        [HostInterval(i, start + 5 * i, start + 5 * i + 5, 5, cpu_s=1.0) for i in range(n)],
    )
    led.update_run(run_id, status="succeeded", ended_at=start + 5 * n, exit_code=0)
    return run_id


@pytest.mark.parametrize(("budget", "max_bytes"), [(7, 10**9), (1000, 4_000)], ids=["rows", "bytes"])
def test_final_goes_with_the_batch_that_leaves_nothing(tmp_path: Path, budget: int, max_bytes: int) -> None:
    n = 40
    with Ledger(f"sqlite:///{tmp_path}/l.db") as led:
        run_id = _ended_run(led, n)
        state = pushes.PushState("https://server", run_id)
        finals, gpu_seqs, host_seqs = [], [], []
        while (built := build_batch(led, state, budget=budget, max_bytes=max_bytes)) is not None:
            batch, state = built  # as if the server acknowledged it
            finals.append(batch["final"])
            gpu_seqs += [row[1] for row in batch["gpu_rows"]]
            host_seqs += [row[0] for row in batch["host_rows"]]
            if batch["final"]:
                break
    assert len(finals) >= 3, finals  # the test is about a run that needs several batches
    assert finals == [False] * (len(finals) - 1) + [True]
    assert sorted(gpu_seqs) == list(range(n)) and sorted(host_seqs) == list(range(n))  # all, each once
