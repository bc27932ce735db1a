"""A simulated month of a GPU cluster for the cost tests, and the bill computed independently.

``simulate`` makes runs over several teams, GPU models and instance types: shared GPUs (two runs
on one GPU, intervals on a common grid, per-process SM shares), MIG slices, killed / lost / failed
runs, resumed runs, runs crossing the month's edges, intervals straddling midnight and a mid-day
price change. ``expected_bill`` prices the generated truth with plain floats, interval by
interval, without any gpuledger cost code, so the report can be checked against it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from fractions import Fraction

import sqlalchemy as sa

from cost_support import card, ts
from gpuledger.core.model import GpuIdentity, GpuInterval, RunRecord
from gpuledger.store import Ledger, codec, schema

STEP = 900.0  # recording interval of the simulated runs
MONTH = ("2026-03-01", "2026-04-01")
CHANGE_MIDNIGHT = ts("2026-03-16")  # A100 40 GB: 2.74 -> 2.50
CHANGE_MIDDAY = ts("2026-03-20T12:07:30")  # p4d.24xlarge: 21.96 -> 19.20 per instance-hour

CARD_TEXT = """
[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "2.74"
effective_to = 2026-03-16

[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "2.50"
effective_from = 2026-03-16

[[gpu]]
model = "A100-80GB-SXM"
price_per_hour = "3.43"

[[gpu]]
model = "H100-SXM"
price_per_hour = "6.88"

[[gpu]]
model = "T4"
price_per_hour = "0.526"

[[gpu]]
model = "L4"
price_per_hour = "0.805"

[[gpu]]
model = "V100"
purchase_price = "9000"
lifetime_years = 3
expected_utilisation = "0.6"
power_price_per_kwh = "0.21"
pue = "1.4"

[[instance]]
type = "p4d.24xlarge"
gpu_model = "A100-40GB-SXM"
gpus = 8
price_per_hour = "21.96"
effective_to = 2026-03-20T12:07:30Z

[[instance]]
type = "p4d.24xlarge"
gpu_model = "A100-40GB-SXM"
gpus = 8
price_per_hour = "19.20"
effective_from = 2026-03-20T12:07:30Z

[[instance]]
type = "g4dn.12xlarge"
gpu_model = "T4"
gpus = 4
"""

V100_RATE = Fraction("0.570776")  # 9000 / (3 x 8760 x 0.6) = 0.5707762..., rounded to 6 places as documented
# (NVML name, model, rate per GPU-hour or None, instance types, GPUs per node, watts)
KINDS = [
    ("NVIDIA A100-SXM4-40GB", "A100-40GB-SXM", None, ["p4d.24xlarge", None], 8, 330.0),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB-SXM", Fraction("3.43"), [None], 8, 360.0),
    ("NVIDIA H100 80GB HBM3", "H100-SXM", Fraction("6.88"), ["p5.48xlarge"], 8, 600.0),
    ("Tesla T4", "T4", Fraction("0.526"), ["g4dn.12xlarge", "x9.unknown"], 4, 60.0),
    ("NVIDIA L4", "L4", Fraction("0.805"), ["g6.xlarge"], 1, 65.0),
    ("Tesla V100-SXM2-16GB", "V100", V100_RATE, [None], 8, 250.0),
    ("NVIDIA GeForce RTX 4090", "RTX-4090", None, [None], 2, 400.0),  # no rate: unpriced
]
TEAMS = {"vision": ["det", "seg"], "nlp": ["llm", "asr"], "ops": ["infra"], "research": ["rl", "gen"], "edge": ["tiny"]}


@dataclass
class Device:
    uuid: str
    name: str
    profile: str | None = None
    # (t0, t1, busy_s, energy_j, proc_sm_pct): what this run recorded for the device
    intervals: list[tuple[float, float, float | None, float | None, float | None]] = field(default_factory=list)


@dataclass
class SimRun:
    id: str
    team: str
    project: str
    user: str
    status: str
    start: float
    ended_at: float | None
    instance: str | None
    kind: int
    devices: list[Device]
    attempt_of: str | None = None
    shared_with: str | None = None  # the run sharing this run's GPU (single-GPU shared pairs)


def _grid_intervals(
    start: float, end: float, util: float | None, watts: float | None, sm: float | None, rng: random.Random
):
    out, t = [], start
    while t < end:
        b = min(end, t + STEP)
        u = None if util is None else min(1.0, max(0.0, util + rng.uniform(-0.1, 0.1)))
        out.append((t, b, None if u is None else (b - t) * u, None if watts is None else (b - t) * watts, sm))
        t = b
    return out


def simulate(n_runs: int, seed: int = 7) -> list[SimRun]:
    rng = random.Random(seed)
    lo, hi = ts("2026-02-25"), ts("2026-04-02")
    runs: list[SimRun] = []
    users = [f"user{i:02d}" for i in range(40)]
    while len(runs) < n_runs:
        i = len(runs)
        team = rng.choice(sorted(TEAMS))
        project = rng.choice(TEAMS[team])
        user = users[(sorted(TEAMS).index(team) * 8 + rng.randrange(8)) % len(users)]  # not hash(): seeded
        kind = rng.choices(range(len(KINDS)), weights=[5, 3, 2, 3, 2, 2, 1])[0]
        name, model, _, instances, per_node, watts = KINDS[kind]
        instance = rng.choice(instances)
        hours = min(30.0, rng.lognormvariate(1.2, 0.9))
        roll = rng.random()
        if roll < 0.06 and len(runs) + 2 <= n_runs:  # a shared pair on one GPU, on the 900 s grid
            runs += _shared_pair(rng, i, team, project, user, kind, instance, lo, hi, hours)
            continue
        start = rng.uniform(lo, hi)
        end = start + hours * 3600
        gpus = min(per_node, rng.choice([1, 1, 1, 2, 4, 8]))
        util = rng.uniform(0.05, 0.98)
        profile = None
        if model == "A100-80GB-SXM" and rng.random() < 0.3:  # a MIG slice: no utilisation, no energy
            profile, gpus, util, watts = rng.choice(["1g.10gb", "3g.40gb", "2g.20gb"]), 1, None, None
        status = rng.choices(["succeeded", "killed", "lost", "failed"], weights=[88, 5, 3, 4])[0]
        devices = []
        for g in range(gpus):
            uuid = f"MIG-{i}-{g}" if profile else f"GPU-{i}-{g}"
            devices.append(Device(uuid, name, profile, _grid_intervals(start, end, util, watts, None, rng)))
        ended_at: float | None = end
        if status == "killed":
            ended_at = end + rng.uniform(10, 3600)  # noticed later; priced to the last interval
        elif status == "lost":
            ended_at = None
        run = SimRun(f"run-{i:05d}", team, project, user, status, start, ended_at, instance, kind, devices)
        runs.append(run)
        if rng.random() < 0.03 and len(runs) < n_runs:  # resumed: a second attempt of the same training
            s2 = end + rng.uniform(60, 7200)
            e2 = s2 + rng.uniform(0.5, 6) * 3600
            devs = [
                Device(f"GPU-{i}-r{g}", name, None, _grid_intervals(s2, e2, 0.7, KINDS[kind][5], None, rng))
                for g in range(1)
            ]
            runs.append(
                SimRun(
                    f"run-{i:05d}-b", team, project, user, "succeeded", s2, e2, instance, kind, devs, attempt_of=run.id
                )
            )
    return runs


def _shared_pair(rng, i, team, project, user, kind, instance, lo, hi, hours):  # type: ignore[no-untyped-def]
    name, _, _, _, _, watts = KINDS[kind]
    a0 = round(rng.uniform(lo, hi) / STEP) * STEP
    a1 = a0 + max(2, round(hours * 3600 / STEP)) * STEP
    b0 = a0 + rng.randrange(1, int((a1 - a0) / STEP)) * STEP
    b1 = b0 + rng.randrange(2, 40) * STEP
    uuid = f"GPU-shared-{i}"
    device_util = rng.uniform(0.4, 0.95)
    out = []
    for rid, s, e, sm, other in (
        (f"run-{i:05d}", a0, a1, 60.0, f"run-{i + 1:05d}"),
        (f"run-{i + 1:05d}", b0, b1, 25.0, f"run-{i:05d}"),
    ):
        ivs = [(t0, t1, (t1 - t0) * device_util, (t1 - t0) * watts, sm) for t0, t1 in _slots(s, e)]
        dev = Device(uuid, name, None, ivs)
        out.append(
            SimRun(
                rid,
                team,
                project,
                user if sm > 50 else "user39",
                "succeeded",
                s,
                e,
                instance,
                kind,
                [dev],
                shared_with=other,
            )
        )
    return out


def _slots(s: float, e: float) -> list[tuple[float, float]]:
    out, t = [], s
    while t < e:
        out.append((t, min(e, t + STEP)))
        t += STEP
    return out


# -- writing the ledger -----------------------------------------------------------------------------


def write(led: Ledger, runs: list[SimRun]) -> None:
    """Runs, labels, GPUs and intervals in bulk INSERTs, rows made by the ledger's own codec
    (``Ledger.create_run`` / ``append`` check each record for replays, which a fresh ledger does
    not need and which would make the test slow)."""
    db = led.database

    def batch(conn, chunk):  # type: ignore[no-untyped-def]
        run_rows, labels, devices, intervals = [], [], [], []
        for r in chunk:
            tags = {"team": r.team, "project": r.project}
            if r.instance:
                tags["instance_type"] = r.instance
            record = RunRecord(
                id=r.id,
                command=["train"],
                user=r.user,
                host="node",
                cwd="/",
                started_at=r.start,
                status=r.status,
                ended_at=r.ended_at,
                labels=tags,
                attempt_of=r.attempt_of,
            )
            run_rows.append(codec.run_row(record))
            labels += codec.label_rows(r.id, tags)
            for n, d in enumerate(r.devices):
                devices.append(codec.to_row(GpuIdentity(n, d.uuid, d.name, mig_profile=d.profile), run_id=r.id))
                for k, (a, b, busy, energy, sm) in enumerate(d.intervals):
                    iv = GpuInterval(
                        device_uuid=d.uuid, seq=k, t0=a, t1=b, busy_s=busy, energy_j=energy, proc_sm_util_avg_pct=sm
                    )
                    intervals.append(codec.to_row(iv, run_id=r.id))
        for table, rows in (
            (schema.runs, run_rows),
            (schema.run_labels, labels),
            (schema.devices, devices),
            (schema.gpu_intervals, intervals),
        ):
            conn.execute(sa.insert(table), rows)

    for k in range(0, len(runs), 1000):
        chunk = runs[k : k + 1000]
        db.write(lambda conn, chunk=chunk: batch(conn, chunk))


# -- the bill, computed independently --------------------------------------------------------------

CARD = card(CARD_TEXT)
_A100_40 = [(None, CHANGE_MIDNIGHT, Fraction("2.74")), (CHANGE_MIDNIGHT, None, Fraction("2.50"))]
_P4D = [(None, CHANGE_MIDDAY, Fraction("21.96") / 8), (CHANGE_MIDDAY, None, Fraction("19.20") / 8)]
_MIG = {"1g.10gb": Fraction(1, 7), "2g.20gb": Fraction(2, 7), "3g.40gb": Fraction(3, 7)}


def _periods(run: SimRun) -> list[tuple[float | None, float | None, Fraction | None]]:
    _, model, rate, _, _, _ = KINDS[run.kind]
    if run.instance == "p4d.24xlarge":
        return _P4D
    if model == "A100-40GB-SXM":
        return _A100_40
    return [(None, None, rate)]


@dataclass
class Bill:
    cost: float = 0.0
    alloc_h: float = 0.0
    busy_h: float = 0.0
    energy_kwh: float = 0.0
    unpriced_h: float = 0.0
    runs: set[str] = field(default_factory=set)


def _pieces(run: SimRun, by_id: dict[str, SimRun]) -> list[tuple[float, float, float, float | None, float | None]]:
    """(t0, t1, held s, busy s, energy J) of every interval, after the split of a shared GPU."""
    out = []
    other = by_id.get(run.shared_with) if run.shared_with else None
    other_slots = {(a, b): sm for a, b, _, _, sm in other.devices[0].intervals} if other else {}
    frac = float(_MIG.get(run.devices[0].profile or "", Fraction(1)))
    for dev in run.devices:
        for a, b, busy, energy, sm in dev.intervals:
            share = 1.0
            if (a, b) in other_slots:
                share = sm / (sm + other_slots[(a, b)])
            w = share * frac
            out.append((a, b, (b - a) * w, None if busy is None else busy * w, None if energy is None else energy * w))
    return out


def expected_bill(runs: list[SimRun], start: float, end: float) -> dict[str, Bill]:
    """Per team (and "TOTAL"): cost on the busy basis, held / busy hours, facility kWh; plain
    floats, interval by interval, split in proportion to time at the window and price changes."""
    by_id = {r.id: r for r in runs}
    bills: dict[str, Bill] = {}
    for run in runs:
        periods = [(p0, p1, None if rate is None else float(rate)) for p0, p1, rate in _periods(run)]
        v100 = KINDS[run.kind][1] == "V100"
        for a, b, held, busy, energy in _pieces(run, by_id):
            for p0, p1, rate in periods:
                x, y = max(a, start, p0 if p0 is not None else a), min(b, end, p1 if p1 is not None else b)
                if y <= x:
                    continue
                part = (y - x) / (b - a)
                h = held * part / 3600
                bh = None if busy is None else busy * part / 3600
                kwh = None if energy is None else energy * part / 3.6e6 * (1.4 if v100 else 1.0)
                for key in (run.team, "TOTAL"):
                    bill = bills.setdefault(key, Bill())
                    bill.alloc_h += h
                    bill.busy_h += bh or 0.0
                    bill.energy_kwh += kwh or 0.0
                    if rate is None:
                        bill.unpriced_h += h
                    else:
                        bill.cost += (h if bh is None else bh) * rate
                        if v100 and kwh:
                            bill.cost += kwh * 0.21
                    bill.runs.add(run.attempt_of or run.id)
    return bills
