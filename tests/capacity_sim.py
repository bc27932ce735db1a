"""A simulated GPU fleet for a month, and what its capacity report must say, computed here without
any gpuledger capacity or cost code.

The fleet (March 2026): two on-prem A100 80 GB hosts in pool "train" (energy billed), a cloud host
of A100 40 GB priced as p4d.24xlarge (pool "cloud"), an L4 host with a mid-day price change, and a
workstation's T4 no agent watches (known only from its runs). One GPU moves from a100-01 to
a100-02 (a day and a half in transit: unobserved), one disappears on the 20th, one is never used,
the L4 host's agent is down for two days, and two runs share one GPU. Agent intervals have random
lengths (crossing midnights) and random state splits; every presence edge is on a whole hour.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction

from cost_support import card, ts
from gpuledger.core.capacity.model import CapacityInterval, Sighting, States
from gpuledger.core.model import GpuIdentity, GpuInterval, RunRecord
from gpuledger.store import Ledger
from gpuledger.store.capacity import write_capacity

H = 3600
START, END = ts("2026-03-01"), ts("2026-04-01")
L4_CHANGE = ts("2026-03-16T12:00")
CARD_TEXT = """
[[gpu]]
model = "A100-80GB-SXM"
purchase_price = "15000"
lifetime_years = 4
expected_utilisation = "0.5"
power_price_per_kwh = "0.20"
pue = "1.3"

[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "2.00"

[[instance]]
type = "p4d.24xlarge"
gpu_model = "A100-40GB-SXM"
gpus = 8
price_per_hour = "21.96"

[[gpu]]
model = "L4"
price_per_hour = "0.80"
effective_to = 2026-03-16T12:00:00Z

[[gpu]]
model = "L4"
price_per_hour = "0.90"
effective_from = 2026-03-16T12:00:00Z

[[gpu]]
model = "T4"
price_per_hour = "0.50"
"""
POOLS_TEXT = """
[[pool]]
name = "train"
hosts = ["a100-*"]

[[pool]]
name = "cloud"
hosts = ["p4d-*"]
instance_type = "p4d.24xlarge"
"""
CARD = card(CARD_TEXT)
A100_80, A100_40, L4, T4 = "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB", "NVIDIA L4", "Tesla T4"
# The documented on-prem rule: purchase / (years x 8760 x utilisation), rounded half-even to 6 places.
ONPREM_RATE = Fraction((Decimal(15000) / (4 * 8760 * Decimal("0.5"))).quantize(Decimal("0.000001"), ROUND_HALF_EVEN))
PUE, POWER = Fraction("1.3"), Fraction("0.20")


def rate_of(model: str, t: float) -> Fraction:
    """The price per GPU-hour of a GPU of the fleet at ``t``, as the card above says."""
    if model == A100_80:
        return ONPREM_RATE
    if model == A100_40:  # every A100 40 GB is on p4d-01: the instance's price / its 8 GPUs
        return Fraction("21.96") / 8
    if model == L4:
        return Fraction("0.80") if t < L4_CHANGE else Fraction("0.90")
    return Fraction("0.50")


@dataclass
class SimGpu:
    uuid: str
    name: str
    stays: list[tuple[str, float, float]]  # (host, from, to): where it was
    down: list[tuple[float, float]] = field(default_factory=list)  # its agent was not running
    never_used: bool = False
    watts: float = 300.0

    @property
    def first(self) -> float:
        return self.stays[0][1]

    @property
    def last(self) -> float:
        return self.stays[-1][2]


def fleet() -> list[SimGpu]:
    gpus = [SimGpu(f"GPU-a1-{i}", A100_80, [("a100-01", START, END)]) for i in range(4)]
    gpus += [SimGpu(f"GPU-a2-{i}", A100_80, [("a100-02", START, END)]) for i in range(4)]
    gpus.append(SimGpu("GPU-mover", A100_80, [("a100-01", START, ts("2026-03-10T12:00")),
                                               ("a100-02", ts("2026-03-12"), END)]))  # fmt: skip
    gpus += [SimGpu(f"GPU-p4d-{i}", A100_40, [("p4d-01", START, END)], watts=250.0) for i in range(3)]
    gpus.append(SimGpu("GPU-p4d-3", A100_40, [("p4d-01", START, ts("2026-03-20T12:00"))], watts=250.0))
    down = [(ts("2026-03-05"), ts("2026-03-07"))]
    gpus.append(SimGpu("GPU-l4-0", L4, [("l4-01", START, END)], down, watts=60.0))
    gpus.append(SimGpu("GPU-l4-1", L4, [("l4-01", START, END)], down, never_used=True, watts=60.0))
    return gpus


def observed_pieces(g: SimGpu) -> list[tuple[str, float, float]]:
    out = []
    for host, a, b in g.stays:
        cuts = [(max(a, d0), min(b, d1)) for d0, d1 in g.down if d0 < b and d1 > a]
        t = a
        for c0, c1 in sorted(cuts):
            if c0 > t:
                out.append((host, t, c0))
            t = max(t, c1)
        if t < b:
            out.append((host, t, b))
    return out


@dataclass
class Truth:
    """What the report must say, per host and in total: milliseconds per state, unobserved and
    fleet milliseconds, asset cost and energy cost (exact fractions of the currency)."""

    state_ms: dict[str, list[int]] = field(default_factory=dict)  # host -> 4 states
    unobserved_ms: dict[str, int] = field(default_factory=dict)
    fleet_ms: dict[str, int] = field(default_factory=dict)
    asset: dict[str, Fraction] = field(default_factory=dict)
    energy_cost: dict[str, Fraction] = field(default_factory=dict)
    gpu_seconds: int = 0

    def add(self, table: dict, host: str, value: object) -> None:
        table[host] = table.get(host, 0) + value


def agent_intervals(gpus: list[SimGpu], seed: int = 11) -> tuple[list[CapacityInterval], list[Sighting], Truth]:
    rng = random.Random(seed)
    ivs: list[CapacityInterval] = []
    sights: list[Sighting] = []
    truth = Truth()
    for g in gpus:
        for host, a, b in observed_pieces(g):
            t = int(a * 1000)
            end = int(b * 1000)
            while t < end:
                span = min(end - t, rng.randrange(60_000, 6 * H * 1000))
                if g.never_used:
                    parts = [span, 0, 0, 0]
                else:
                    cuts = sorted(rng.randrange(0, span + 1) for _ in range(3))
                    parts = [cuts[0], cuts[1] - cuts[0], cuts[2] - cuts[1], span - cuts[2]]
                energy = g.watts * span / 1000
                ivs.append(CapacityInterval(g.uuid, host, t, t + span, States(*parts), 0, energy))
                states = truth.state_ms.setdefault(host, [0, 0, 0, 0])
                for i in range(4):
                    states[i] += parts[i]
                if g.name == A100_80:  # energy billed on the on-prem line only
                    truth.add(truth.energy_cost, host, Fraction(energy) / 3_600_000 * PUE * POWER)
                t += span
            sights.append(Sighting(g.uuid, g.name, host, a, b))
        # in the fleet from its first sighting to its last: the gaps are unobserved, on the host it
        # was last seen on
        seen = observed_pieces(g)
        for (h0, _, b0), (_, a1, _) in itertools.pairwise(seen):
            truth.add(truth.unobserved_ms, h0, int((a1 - b0) * 1000))
        presence = [(h, a, b) for h, a, b in seen]
        for (h0, _, b0), (_, a1, _) in itertools.pairwise(seen):
            presence.append((h0, b0, a1))
        for host, a, b in presence:
            truth.add(truth.fleet_ms, host, int((b - a) * 1000))
            truth.gpu_seconds += int(b - a)
            for h0, h1 in _hours(a, b):
                truth.add(truth.asset, host, Fraction(int(h1 - h0), H) * rate_of(g.name, h0))
    return ivs, sights, truth


def _hours(a: float, b: float) -> list[tuple[float, float]]:
    out, t = [], a
    while t < b:
        out.append((t, min(b, t + H)))
        t += H
    return out


# -- runs: what the chargeback bills, and the workstation GPU known only from runs -----------------


@dataclass
class SimRun:
    id: str
    team: str | None
    gpu: str
    name: str
    host: str
    start: float
    end: float
    util: float
    watts: float
    sm: float | None = None  # per-process SM share (a shared GPU)
    instance: str | None = None


def runs() -> list[SimRun]:
    return [
        SimRun("r-none", None, "GPU-mover", A100_80, "a100-01", START, START + 6 * H, 0.5, 300.0),
        SimRun("r-v1", "vision", "GPU-a1-0", A100_80, "a100-01", ts("2026-03-02"), ts("2026-03-04"), 0.6, 300.0),
        SimRun("r-v2", "vision", "GPU-a2-1", A100_80, "a100-02", ts("2026-03-15"), ts("2026-03-16"), 0.7, 350.0, 50),
        SimRun("r-n1", "nlp", "GPU-a2-1", A100_80, "a100-02", ts("2026-03-15"), ts("2026-03-16"), 0.7, 350.0, 50),
        SimRun(
            "r-n2",
            "nlp",
            "GPU-p4d-0",
            A100_40,
            "p4d-01",
            ts("2026-03-20"),
            ts("2026-03-21"),
            0.8,
            250.0,
            instance="p4d.24xlarge",
        ),
        SimRun("r-e1", "edge", "GPU-l4-0", L4, "l4-01", ts("2026-03-16T06:00"), ts("2026-03-16T18:00"), 0.5, 60.0),
        SimRun("r-e2", "edge", "GPU-ws", T4, "ws-01", ts("2026-03-03"), ts("2026-03-03T10:00"), 0.4, 70.0),
        SimRun("r-e3", "edge", "GPU-ws", T4, "ws-01", ts("2026-03-25"), ts("2026-03-25T05:00"), 0.9, 70.0),
    ]


def record_runs(led: Ledger, sims: list[SimRun]) -> None:
    for r in sims:
        labels = {k: v for k, v in (("team", r.team), ("instance_type", r.instance)) if v}
        led.create_run(RunRecord(id=r.id, command=["train"], user="u", host=r.host, cwd="/", started_at=r.start,
                                 ended_at=r.end, status="succeeded", labels=labels))  # fmt: skip
        led.add_devices(r.id, [GpuIdentity(0, r.gpu, r.name)])
        ivs = [GpuInterval(r.gpu, k, a, b, busy_s=(b - a) * r.util, energy_j=(b - a) * r.watts,
                           proc_sm_util_avg_pct=r.sm) for k, (a, b) in enumerate(_hours(r.start, r.end))]  # fmt: skip
        led.append(r.id, ivs)


@dataclass
class Bill:
    billed: Fraction = Fraction(0)
    allocated_h: Fraction = Fraction(0)
    busy_h: Fraction = Fraction(0)


def expected_bills(sims: list[SimRun]) -> dict[str | None, Bill]:
    """The busy-basis chargeback of the runs, hour by hour: busy hours x the rate then, plus billed
    energy; a GPU two runs hold at once is split by their SM shares (here equal)."""
    holders: dict[tuple[str, float], int] = {}
    for r in sims:
        for a, _ in _hours(r.start, r.end):
            holders[(r.gpu, a)] = holders.get((r.gpu, a), 0) + 1
    out: dict[str | None, Bill] = {}
    for r in sims:
        bill = out.setdefault(r.team, Bill())
        for a, b in _hours(r.start, r.end):
            share = Fraction(1, holders[(r.gpu, a)])
            hours = Fraction(int(b - a), H) * share
            busy = hours * Fraction(str(r.util))
            rate = Fraction("21.96") / 8 if r.instance == "p4d.24xlarge" else rate_of(r.name, a)
            bill.billed += busy * rate
            if r.name == A100_80:
                bill.billed += Fraction(r.watts) * hours / 1000 * PUE * POWER
            bill.allocated_h += hours
            bill.busy_h += busy
    return out


def workstation_truth(sims: list[SimRun]) -> tuple[int, list[int], Fraction]:
    """The T4 no agent watches: in the fleet from its first run's start to its last run's end,
    held while a run held it, busy as the runs measured (fleet ms, 4 states ms, asset cost)."""
    mine = [r for r in sims if r.gpu == "GPU-ws"]
    first, last = min(r.start for r in mine), max(r.end for r in mine)
    fleet_ms = int((last - first) * 1000)
    held = sum(int((r.end - r.start) * 1000) for r in mine)
    busy = sum(round((r.end - r.start) * r.util * 1000) for r in mine)
    return fleet_ms, [fleet_ms - held, held - busy, busy, 0], Fraction(fleet_ms, H * 1000) * Fraction("0.50")


def load(url: str) -> tuple[list[SimGpu], Truth, list[SimRun]]:
    gpus = fleet()
    ivs, sights, truth = agent_intervals(gpus)
    sims = runs()
    with Ledger(url) as led:
        for i in range(0, len(ivs), 2000):
            chunk = ivs[i : i + 2000]
            led.write(lambda c, chunk=chunk: write_capacity(led.database, c, chunk, []))
        led.write(lambda c: write_capacity(led.database, c, [], sights))
        record_runs(led, sims)
    return gpus, truth, sims
