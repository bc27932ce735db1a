"""Recomputing a series-only run's stream sums (store/series_streams.py) says what the store lost.

A run that became series-only before migration 20 has streams marked incomplete; ``recompute``
sums the rows the store holds of it. On the real PostgreSQL ledger and compact PostgreSQL store: a
run all of whose rows the store holds is completed; a run one of whose days the store dropped past
its window stays incomplete (its sums n/a, not a short sum shown as the whole), and ``db migrate
--series`` says which run and which days.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

import test_series_tier as tiers
from gpuledger.cli.main import cli
from gpuledger.store import Ledger, codec, schema, series_day_sums, series_streams, series_tier, series_window
from gpuledger.store.schema_series_streams import GAUGES
from server_support import NOW
from test_store_records import full_gpu, full_host, minimal_run, run_id

pytestmark = pytest.mark.postgres

pg_url = tiers.pg_url
TODAY = math.floor(NOW / 86400)
OLD, RECENT = TODAY - 10, TODAY - 2  # the run's two days; a 5-day store window drops the first
PER_DAY = 10  # rows per stream and day


@pytest.fixture
def store_url(tmp_path: Path) -> Iterator[str]:
    yield from tiers.store_url("postgres", tmp_path, "streams_t")


def _rows(rid: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The run's GPU and host rows as ledger rows without run_id: PER_DAY on each of its two days."""
    gpu, host = [], []
    for k, day in enumerate((OLD, RECENT)):
        for i in range(PER_DAY):
            seq, t0 = k * PER_DAY + i, day * 86400 + 3600.0 + 10.0 * i - (k * PER_DAY + i)  # full_gpu adds seq
            gpu.append(
                {c: v for c, v in codec.to_row(full_gpu("GPU-a", seq, t0=t0), run_id=rid).items() if c != "run_id"}
            )
            host.append({c: v for c, v in codec.to_row(full_host(seq, t0=t0), run_id=rid).items() if c != "run_id"})
    return gpu, host


def _series_only_before_20(led: Ledger, tier: series_tier.Tier, n: int) -> str:
    """A series-only run whose rows the store holds, as a version-19 server left it: segments, day
    sums, and streams that migration 20 marked incomplete (no sums, the highest seq)."""
    rid = run_id(n)
    gpu, host = _rows(rid)
    assert tier.store.write(rid, gpu, host, token=f"t-{rid}") == 2 * len(gpu)

    def tx(conn: sa.Connection) -> None:
        conn.execute(sa.insert(schema.runs), codec.run_row(minimal_run(rid, started_at=gpu[0]["t0"] - 60)))
        conn.execute(sa.insert(schema.series_only_runs).values(run_id=rid, store=tier.url, marked_at=NOW))
        last = 2 * PER_DAY - 1
        conn.execute(sa.insert(schema.series_segments), [
            {"run_id": rid, "device_uuid": u, "first_seq": 0, "last_seq": last, "t0": gpu[0]["t0"], "t1": gpu[-1]["t1"]}
            for u in ("GPU-a", series_streams.HOST)
        ])  # fmt: skip
        columns = list(gpu[0])
        series_day_sums.add(conn, rid, [[r[c] for c in columns] for r in gpu], columns)
        blank = dict.fromkeys((*GAUGES, *series_streams._SUMS))
        conn.execute(sa.insert(schema.series_streams), [
            {"run_id": rid, "device_uuid": u, "complete": False, "last_seq": last, **blank}
            for u in ("GPU-a", series_streams.HOST)
        ])  # fmt: skip

    led.write(tx)
    return rid


def _streams(led: Ledger, rid: str) -> dict[str, dict[str, Any]]:
    return {u: r for (_, u), r in led.read(lambda c: series_streams.read(c, [rid])).items()}


def test_a_run_whose_day_the_store_dropped_keeps_na_sums_and_the_cli_names_the_day(
    pg_url: str, store_url: str, tmp_path: Path
) -> None:
    tier = series_tier.Tier.open(store_url, series_days=5)
    try:
        with Ledger(pg_url) as led:
            whole = _series_only_before_20(led, tier, 1)
            done = led.write(lambda c: series_streams.recompute(c, whole, tier.store))
            assert done == series_streams.Recomputed(completed=2)
            got = _streams(led, whole)
            assert got["GPU-a"]["complete"] and got[series_streams.HOST]["complete"]
            assert series_streams.cpu_us(got[series_streams.HOST]) is not None

            cut = _series_only_before_20(led, tier, 2)
            dropped = series_window.keep_window(led, tier, actor="test", now=NOW).dropped
            assert series_day_sums.iso_day(OLD) in dropped and series_day_sums.iso_day(RECENT) not in dropped
            assert len(tier.store.gpu_intervals(cut)) == PER_DAY  # the recent day's rows only
            left = led.write(lambda c: series_streams.recompute(c, cut, tier.store))
            assert left == series_streams.Recomputed(short=2, expired=(series_day_sums.iso_day(OLD),))
            got = _streams(led, cut)
            assert not got["GPU-a"]["complete"] and not got[series_streams.HOST]["complete"]
            assert series_streams.cpu_us(got[series_streams.HOST]) is None  # n/a, not half the CPU time
            assert set(series_streams.throttle_us(got["GPU-a"]).values()) == {None}
            assert led.read(series_streams.incomplete_runs) == [cut]
    finally:
        tier.store.close()
    args = ["db", "migrate", "--db", pg_url, "--series", store_url, "--series-days", "5"]
    out = CliRunner().invoke(cli, args, env={"GPULEDGER_HOME": str(tmp_path / "h")})
    assert out.exit_code == 0, out.output
    assert f"run {cut} keeps n/a host CPU and throttle sums: the store no longer holds all of its rows" in out.output
    assert f"(its days {series_day_sums.iso_day(OLD)} are past the store's window)" in out.output
    assert "recomputed the host CPU and throttle sums" not in out.output
