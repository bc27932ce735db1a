"""Many node agents writing at once into the ClickHouse series store (docs/SCALE.md, step 5), on the
real engine in-process (chDB): every interval stored exactly once, a resent batch (same token)
stores nothing, the rollups are not doubled, and the chargeback read from the rollups and the run
dimensions equals the agents' own sums.

chDB runs no asynchronous insert queue (async_insert is accepted and ignored: the insert is
synchronous), and a ClickHouse server refuses async inserts together with the rollup view's
dedup; so the store inserts synchronously, and concurrency comes from concurrent writers.
"""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from datetime import date
from typing import Any

import pytest

from ci_support import need_module

need_module("chdb", "pip install 'gpuledger[clickhouse]'")

from gpuledger.series.clickhouse import ClickHouseSeries  # noqa: E402

T0 = 1_780_000_000  # 2026-05-28, inside the raw window below
AGENTS, GPUS, PER_BATCH, BATCHES = 12, 8, 12, 6  # 96 intervals a batch: one minute of 8 GPUs at 5 s


@pytest.fixture
def store(chdb_series: ClickHouseSeries) -> ClickHouseSeries:
    return chdb_series


def _batch(agent: int, b: int, rng: random.Random) -> list[dict[str, Any]]:
    rows = []
    for g in range(GPUS):
        for i in range(PER_BATCH):
            seq = b * PER_BATCH + i
            t0 = T0 + 5.0 * seq
            busy = rng.randint(0, 5000) / 1000
            rows.append({
                "device_uuid": f"GPU-{agent:03d}-{g}", "seq": seq, "t0": t0, "t1": t0 + 5.0, "samples": 30,
                "busy_s": busy, "util_idle_s": 5.0 - busy, "energy_j": rng.randint(300_000, 3_000_000) / 1000,
                "util_method": "samples", "energy_method": "counter", "throttle_s": {},
            })  # fmt: skip
    return rows


def _agents() -> dict[str, list[list[dict[str, Any]]]]:
    rng = random.Random(38)
    return {f"run-{a}": [_batch(a, b, rng) for b in range(BATCHES)] for a in range(AGENTS)}


def test_concurrent_agents_store_every_interval_once_and_resends_nothing(store: ClickHouseSeries) -> None:
    sent = _agents()
    stored: dict[str, int] = defaultdict(int)
    errors: list[BaseException] = []

    def agent(run_id: str, batches: list[list[dict[str, Any]]]) -> None:
        try:
            for b, rows in enumerate(batches):
                stored[run_id] += store.write(run_id, rows, [], f"{run_id}:{b}")
                if b % 2:  # the acknowledgement was lost: the agent sends the batch again
                    stored[run_id] += store.write(run_id, rows, [], f"{run_id}:{b}")
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=agent, args=item) for item in sent.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    # every batch again, from another thread: the engine drops them all
    redo = [threading.Thread(target=lambda r=r, bs=bs: [store.write(r, x, [], f"{r}:{i}") for i, x in enumerate(bs)])
            for r, bs in sent.items()]  # fmt: skip
    for t in redo:
        t.start()
    for t in redo:
        t.join()

    per_run = {r: GPUS * PER_BATCH * BATCHES for r in sent}
    assert dict(stored) == per_run  # write() counted each interval once
    rollups = defaultdict(lambda: [0, 0.0, 0.0])
    for r in store.day_rollups(T0 - 86400, T0 + 86400):
        acc = rollups[r.run_id]
        acc[0] += r.intervals
        acc[1] += r.busy_s or 0.0
        acc[2] += r.energy_j or 0.0
    for run_id, batches in sent.items():
        rows = [x for b in batches for x in b]
        back = store.gpu_intervals(run_id)
        assert len(back) == len(rows) == per_run[run_id]
        assert sorted((x["device_uuid"], x["seq"]) for x in back) == sorted((x["device_uuid"], x["seq"]) for x in rows)
        busy = sum(round(x["busy_s"] * 1000) for x in rows) / 1000
        energy = sum(round(x["energy_j"] * 1000) for x in rows) / 1000
        assert rollups[run_id][0] == len(rows)  # not doubled by the resends
        assert rollups[run_id][1] == pytest.approx(busy, abs=1e-6)
        assert rollups[run_id][2] == pytest.approx(energy, abs=1e-6)


def test_chargeback_from_rollups_and_run_dimensions(store: ClickHouseSeries) -> None:
    sent = _agents()
    for run_id, batches in sent.items():
        for b, rows in enumerate(batches):
            store.write(run_id, rows, [], f"{run_id}:{b}")
    teams = {r: (f"team-{i % 3}", f"proj-{i % 2}", f"user-{i % 4}") for i, r in enumerate(sent)}
    store.put_runs([(r, "old", "old", "old") for r in sent], version_ms=1)
    store.put_runs([(r, *teams[r]) for r in sent], version_ms=2)  # relabelled: the newer wins
    want: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for run_id, batches in sent.items():
        acc = want[teams[run_id]]
        for x in (x for b in batches for x in b):
            acc[0] += 5000
            acc[1] += round(x["busy_s"] * 1000)
            acc[2] += round(x["energy_j"] * 1000)
    got = store.monthly_chargeback(date(2026, 1, 1), date(2026, 12, 31))
    assert {(t, p, u): [a, b, e] for t, p, u, m, a, b, e in got} == dict(want)
    assert {m for *_, m, _a, _b, _e in got} == {date(2026, 5, 1)}
