"""The capacity ledger in SQL (store/capacity.py), on SQLite and PostgreSQL: intervals stored once,
day sums kept equal to the intervals' (checked against a rebuild and against sums made here), the
fleet following a GPU from host to host."""

from __future__ import annotations

import random

import sqlalchemy as sa

from gpuledger.core.capacity.model import DAY_MS, CapacityInterval, Sighting, States
from gpuledger.store import Ledger, schema
from gpuledger.store.capacity import rebuild_days, write_capacity
from gpuledger.store.capacity_queries import day_rows, fleet, intervals
from gpuledger.store.migrations import LATEST

MIDNIGHT = 20_500 * DAY_MS  # 2026-02-16 00:00 UTC


def _random_intervals(rng: random.Random, gpu: str, host: str, t0: int, n: int) -> list[CapacityInterval]:
    out = []
    for _ in range(n):
        span = rng.randrange(1, 20_000)
        cuts = sorted(rng.randrange(0, span + 1) for _ in range(3))
        parts = [cuts[0], cuts[1] - cuts[0], cuts[2] - cuts[1], span - cuts[2]]
        out.append(CapacityInterval(gpu, host, t0, t0 + span, States(*parts), rng.randrange(0, span + 1), 1.5 * span))
        t0 += span
    return out


def _day_sums(ivs: list[CapacityInterval]) -> dict[tuple[str, int], int]:
    """Milliseconds per GPU and day, computed here by walking each interval's days."""
    out: dict[tuple[str, int], int] = {}
    for iv in ivs:
        t = iv.t0_ms
        while t < iv.t1_ms:
            end = min(iv.t1_ms, (t // DAY_MS + 1) * DAY_MS)
            out[(iv.gpu_uuid, t // DAY_MS)] = out.get((iv.gpu_uuid, t // DAY_MS), 0) + end - t
            t = end
    return out


def test_intervals_are_stored_once_and_their_day_sums_stay_exact(ledger_url: str) -> None:
    rng = random.Random(7)
    ivs = _random_intervals(rng, "GPU-a", "node-1", MIDNIGHT - 300_000, 60)  # across midnight
    ivs += _random_intervals(rng, "GPU-b", "node-1", MIDNIGHT - 10_000, 30)
    with Ledger(ledger_url) as led:
        assert led.schema_version() == LATEST
        db = led.database
        assert led.write(lambda c: write_capacity(db, c, ivs[:50])) == 50
        assert led.write(lambda c: write_capacity(db, c, ivs)) == len(ivs) - 50  # a replayed batch adds nothing
        assert led.write(lambda c: write_capacity(db, c, ivs)) == 0
        rows = led.read(lambda c: day_rows(c, 0, 10**6))
        stored = led.read(lambda c: intervals(c))
        assert len(stored) == len(ivs)
        spans = {(r[0], r[1]): sum(r[5:9]) for r in rows}
        assert spans == _day_sums(ivs)
        for gpu in ("GPU-a", "GPU-b"):  # each state's day parts add up to the intervals' figure
            for i, name in enumerate(("unallocated_ms", "alloc_idle_ms", "busy_attr_ms", "busy_unattr_ms")):
                assert sum(r[5 + i] for r in rows if r[0] == gpu) == sum(
                    iv.states.as_tuple()[i] for iv in ivs if iv.gpu_uuid == gpu
                ), name
        assert led.write(lambda c: rebuild_days(db, c)) == len(rows)
        assert sorted(led.read(lambda c: day_rows(c, 0, 10**6))) == sorted(rows)  # incremental == rebuilt


def test_a_broken_interval_is_refused_and_nothing_of_its_batch_is_stored(ledger_url: str) -> None:
    good = CapacityInterval("GPU-a", "n", 0, 1000, States(1000, 0, 0, 0))
    bad = CapacityInterval("GPU-a", "n", 1000, 2000, States(10, 0, 0, 0))
    with Ledger(ledger_url) as led:
        try:
            led.write(lambda c: write_capacity(led.database, c, [good, bad]))
        except ValueError as exc:
            assert "add up" in str(exc)
        else:
            raise AssertionError("accepted states that do not add up")
        assert led.read(lambda c: intervals(c)) == []


def test_a_gpu_that_moves_host_keeps_its_history_and_shows_where_it_is_now(ledger_url: str) -> None:
    t = MIDNIGHT / 1000
    sights = [
        Sighting("GPU-m", "NVIDIA A100-SXM4-80GB", "node-1", t, t + 3600, "p4de.24xlarge", 80 * 2**30),
        Sighting("GPU-m", "NVIDIA A100-SXM4-80GB", "node-2", t + 7200, t + 9000, None, 80 * 2**30),
        Sighting("GPU-m", "NVIDIA A100-SXM4-80GB", "node-1", t + 100, t + 200),  # late, older news
    ]
    with Ledger(ledger_url) as led:
        for s in sights:
            led.write(lambda c, s=s: write_capacity(led.database, c, [], [s]))
        [gpu] = led.read(lambda c: fleet(c))
        assert (gpu.host, gpu.first_seen, gpu.last_seen) == ("node-2", t, t + 9000)
        assert gpu.instance_type == "p4de.24xlarge"  # the newer agent did not say: kept
        assert [(h.host, h.first_seen, h.last_seen) for h in gpu.hosts] == [
            ("node-1", t, t + 3600),
            ("node-2", t + 7200, t + 9000),
        ]
        n = led.read(lambda c: c.scalar(sa.select(sa.func.count()).select_from(schema.gpu_fleet)))
        assert n == 1


def test_a_gpu_moved_from_a_cloud_instance_to_an_on_prem_host_is_priced_as_each_host_had_it(ledger_url: str) -> None:
    # Day 1 on an AWS g6.xlarge (its agent says so: 8.00/h for its one L4), day 2 on an on-prem node
    # whose agent names no instance type (the L4 model price, 1.00/h): 24 x 8 + 24 x 1.
    from cost_support import card
    from gpuledger.core.capacity.fleet import fleet_rows
    from gpuledger.core.capacity.pools import Pools
    from gpuledger.reports.capacity.report import capacity

    rates = card(
        '[[gpu]]\nmodel = "L4"\nprice_per_hour = "1.00"\n\n'
        '[[instance]]\ntype = "g6.xlarge"\ngpu_model = "L4"\ngpus = 1\nprice_per_hour = "8.00"\n'
    )
    day = MIDNIGHT // 1000
    idle = [CapacityInterval("GPU-l4", host, t, t + DAY_MS, States(DAY_MS, 0, 0, 0))
            for host, t in (("cloud-1", MIDNIGHT), ("onprem-1", MIDNIGHT + DAY_MS))]  # fmt: skip
    sights = [Sighting("GPU-l4", "NVIDIA L4", "cloud-1", day, day + 86400, "g6.xlarge"),
              Sighting("GPU-l4", "NVIDIA L4", "onprem-1", day + 86400, day + 2 * 86400)]  # fmt: skip
    with Ledger(ledger_url) as led:
        led.write(lambda c: write_capacity(led.database, c, idle[:1], sights[:1]))
        led.write(lambda c: write_capacity(led.database, c, idle[1:], sights[1:]))
        report = capacity(led, card=rates, pools=Pools(), start=day, end=day + 2 * 86400, by=("host",))
        listed = fleet_rows(led.read(lambda c: fleet(c)), card=rates, pools=Pools(), now=day + 2 * 86400)
    assert {g["host"]: g["asset_cost"] for g in report.groups} == {"cloud-1": "192.00", "onprem-1": "24.00"}
    # `gpuledger fleet` lists it where it is now, with that host's instance type (none)
    assert [(r["host"], r["instance_type"], r["rate"]) for r in listed] == [("onprem-1", None, "1.00")]


def test_migration_11_gives_stored_stays_their_gpus_instance_type(ledger_url: str) -> None:
    from gpuledger.store.engine import Database

    t = MIDNIGHT / 1000
    with Ledger(ledger_url) as led:
        led.write(lambda c: write_capacity(led.database, c, [], [
            Sighting("GPU-m", "NVIDIA A100-SXM4-80GB", "node-1", t, t + 3600, "p4de.24xlarge"),
            Sighting("GPU-m", "NVIDIA A100-SXM4-80GB", "node-2", t + 7200, t + 9000),
        ]))  # fmt: skip
    db = Database(ledger_url)
    try:  # back to what version 10 made: no instance type per stay
        db.write(lambda c: c.execute(sa.text("ALTER TABLE gpu_fleet_hosts DROP COLUMN instance_type")))
        db.write(lambda c: c.execute(sa.delete(schema.schema_version).where(schema.schema_version.c.version >= 11)))
    finally:
        db.close()
    with Ledger(ledger_url) as led:
        assert led.schema_version() == LATEST
        [gpu] = led.read(lambda c: fleet(c))
    # Both stays priced as version 10 priced them: as the GPU's one instance type.
    assert [(h.host, h.instance_type) for h in gpu.hosts] == [("node-1", "p4de.24xlarge"), ("node-2", "p4de.24xlarge")]
