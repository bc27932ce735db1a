"""The ClickHouse raw-interval store (series/clickhouse.py, docs/SCALE.md step 3) on the real engine:
chDB runs ClickHouse in-process, with its data in a temporary folder, so the DDL, the codecs, the
dedup tokens, the rollup view, the TTL and every query here are the engine's own.

What a user of the store would notice: a recorded run comes back as it went in (to the stored
units); a batch sent twice is stored once and summed once; the day rollups are the ledger's day
sums, midnight split included; old days go whole, the others stay; a bad URL, a missing package or
a bad row is a clear error that stores nothing.
"""

from __future__ import annotations

import itertools
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ci_support import need_module
from e2e_helpers import cli_env, run_cli

need_module("chdb", "pip install 'gpuledger[clickhouse]'")

from gpuledger.core.model import GpuInterval, RunRecord  # noqa: E402
from gpuledger.series.clickhouse import BadRow, ClickHouseError, ClickHouseSeries  # noqa: E402
from gpuledger.series.quantum import quantize_gpu, quantize_host  # noqa: E402
from gpuledger.store import Ledger  # noqa: E402
from gpuledger.store import cost_queries as cq  # noqa: E402
from gpuledger.store.schema import gpu_intervals, host_intervals  # noqa: E402

DAY = 86400
TODAY = int(time.time()) // DAY * DAY  # today's UTC midnight
_RUNS = itertools.count()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ClickHouseSeries]:
    """A store in a fresh folder (chDB holds one folder open per process: closed after the test).
    Hypothesis examples share one; each writes runs of its own."""
    s = ClickHouseSeries(f"chdb://{tmp_path}/series", raw_days=30)
    s.create()
    s.create()  # idempotent: a server calls it on every start
    yield s
    s.close()


def _n(day: date) -> int:
    """The ledger's day number (days since the epoch)."""
    return (day - date(1970, 1, 1)).days


def _run_id() -> str:
    return f"run-{next(_RUNS)}-{time.time_ns()}"


def _gpu(uuid: str, seq: int, t0: float, t1: float, **kw: Any) -> dict[str, Any]:
    row = {c.name: None for c in gpu_intervals.columns if c.name != "run_id"}
    row.update(device_uuid=uuid, seq=seq, t0=t0, t1=t1, samples=6, busy_s=(t1 - t0) / 2, energy_j=(t1 - t0) * 250.0)
    row.update(kw)
    return row


def _counts(s: ClickHouseSeries) -> tuple[int, int, int]:
    raw = s.client.query(f"SELECT count() FROM {s.layout.table('gpu_intervals')}")[0][0]
    host = s.client.query(f"SELECT count() FROM {s.layout.table('host_intervals')}")[0][0]
    rolled = s.client.query(f"SELECT sum(intervals) FROM {s.layout.table('gpu_day_rollups')}")[0][0]
    return int(raw), int(host), int(rolled)


# -- a recorded run -------------------------------------------------------------------------------


@pytest.mark.slow  # a real `gpuledger run` of 3 s
def test_recorded_run_round_trip(store: ClickHouseSeries, tmp_path: Path) -> None:
    """A real `gpuledger run --replay-gpus` (the real NVML collector over the scripted NVML and a
    shipped trace) into SQLite; its rows through the store equal quantize_gpu / quantize_host of
    the ledger's rows, and its rollup equals the ledger's own day sums."""
    db = tmp_path / "ledger.db"
    env = cli_env(tmp_path / "home", f"sqlite:///{db}")
    out = run_cli(
        ["run", "-q", "--replay-gpus", "a100x2-example", "--interval", "0.5", "--", sys.executable, "-c",
         "import time; time.sleep(3)"],
        env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr.decode()
    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        (run_id,) = conn.execute(sa.text("SELECT id FROM runs")).one()
        gpu = [dict(r) for r in conn.execute(sa.select(gpu_intervals)).mappings()]
        host = [dict(r) for r in conn.execute(sa.select(host_intervals)).mappings()]
        ledger_days = cq.interval_days(conn, [run_id], None, None)
    engine.dispose()
    for r in gpu + host:
        del r["run_id"]
    assert len({r["device_uuid"] for r in gpu}) == 2 and len(gpu) >= 8 and host
    assert any(r["throttle_s"] for r in gpu) and any(r["busy_s"] for r in gpu)

    assert store.write(run_id, gpu, host, token=f"{run_id}:all") == len(gpu) + len(host)

    want = sorted((quantize_gpu(r) for r in gpu), key=lambda r: (r["device_uuid"], r["seq"]))
    assert store.gpu_intervals(run_id) == want
    one = want[0]["device_uuid"]
    assert store.gpu_intervals(run_id, one) == [r for r in want if r["device_uuid"] == one]
    assert store.host_intervals(run_id) == sorted((quantize_host(r) for r in host), key=lambda r: r["seq"])

    t0, t1 = min(r["t0"] for r in gpu), max(r["t1"] for r in gpu)
    mine = {(r.device_uuid, _n(r.day)): r for r in store.day_rollups(t0, t1) if r.run_id == run_id}
    assert set(mine) == {(d["device_uuid"], d["day"]) for d in ledger_days}
    for d in ledger_days:
        r = mine[(d["device_uuid"], d["day"])]
        assert r.intervals == d["intervals"]
        assert r.busy_s == pytest.approx(d["busy_s"], abs=1e-3 * d["intervals"])
        assert r.energy_j == pytest.approx(d["energy_j"], abs=1e-3 * d["intervals"])


# -- exactly once ---------------------------------------------------------------------------------


def test_resent_batch_stores_nothing_and_rollups_do_not_double(store: ClickHouseSeries) -> None:
    # As on a server whose settings profile turns the views' dedup off: the store must not depend
    # on the server's default (chDB 26.9's is on), so each insert says so itself.
    store.client.command("SET deduplicate_blocks_in_dependent_materialized_views = 0")
    run_id = _run_id()
    t = TODAY + 3600.0
    first = [_gpu("GPU-dedup", i, t + 5 * i, t + 5 * (i + 1)) for i in range(10)]
    host = [{"seq": 0, "t0": t, "t1": t + 50, "samples": 50, "cpu_s": 40.0, "rss_max_b": 1, "read_b": 0,
             "write_b": 0, "threads_max": 4, "procs_max": 1}]  # fmt: skip
    second = [_gpu("GPU-dedup", i, t + 5 * i, t + 5 * (i + 1)) for i in range(10, 20)]
    before = _counts(store)
    assert store.write(run_id, first, host, token=f"{run_id}:0-9") == 11
    assert store.write(run_id, second, [], token=f"{run_id}:10-19") == 10
    after = _counts(store)
    # An agent that never heard the acknowledgement sends the first batch again, after the second.
    assert store.write(run_id, first, host, token=f"{run_id}:0-9") == 0
    assert _counts(store) == after == (before[0] + 20, before[1] + 1, before[2] + 20)
    assert len(store.gpu_intervals(run_id)) == 20 and len(store.host_intervals(run_id)) == 1
    (day,) = [r for r in store.day_rollups(t, t + 100) if r.run_id == run_id]
    assert day.intervals == 20 and day.busy_s == pytest.approx(50.0) and day.allocated_s == pytest.approx(100.0)


def test_a_token_names_the_batch(store: ClickHouseSeries) -> None:
    """The same token again stores nothing even when the rows were encoded anew with a value
    changed (a resend rebuilt from the outbox): the first write of a batch is the one kept."""
    run_id = _run_id()
    rows = [_gpu("GPU-token", i, TODAY + 60.0 * i, TODAY + 60.0 * (i + 1)) for i in range(3)]
    assert store.write(run_id, rows, [], token=f"{run_id}:0-2") == 3
    again = [{**r, "energy_j": r["energy_j"] + 1.0} for r in rows]
    assert store.write(run_id, again, [], token=f"{run_id}:0-2") == 0
    assert [r["energy_j"] for r in store.gpu_intervals(run_id)] == [r["energy_j"] for r in rows]
    (day,) = [r for r in store.day_rollups(TODAY, TODAY + 200) if r.run_id == run_id]
    assert day.energy_j == sum(r["energy_j"] for r in rows)


# -- rollups: the ledger's day sums ---------------------------------------------------------------


def _expected_days(rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, int]]:
    """Per (GPU, day), from the intervals, in the stored units: each interval split at every UTC
    midnight it crosses, a value's part up to an instant being round(v * elapsed / duration), and
    the interval counted on the day it ends (the ledger's rule, store/cost_queries.py)."""

    def ms(x: float) -> int:
        return int(x * 1000 + 0.5)

    def part(v: int, elapsed: int, dur: int) -> int:
        return (2 * v * elapsed + dur) // (2 * dur)

    out: dict[tuple[str, int], dict[str, int]] = {}
    for r in rows:
        a0, a1 = ms(r["t0"]), ms(r["t1"])
        dur = a1 - a0
        day = a0 // (DAY * 1000)
        while True:
            pa, pb = max(a0, day * DAY * 1000), min(a1, (day + 1) * DAY * 1000)
            s = out.setdefault(
                (r["device_uuid"], day), {"intervals": 0, "alloc": 0, "busy": 0, "busy_n": 0, "energy": 0}
            )
            s["alloc"] += pb - pa
            s["intervals"] += int(pb == a1)
            for col, key in (("busy_s", "busy"), ("energy_j", "energy")):
                if r[col] is not None:
                    v = ms(r[col])
                    s[key] += v if dur == 0 else part(v, pb - a0, dur) - part(v, pa - a0, dur)
                    s["busy_n"] += col == "busy_s"
            if pb == a1:
                break
            day += 1
    return out


@st.composite
def interval_sets(draw: st.DrawFn) -> list[dict[str, Any]]:
    """One or two GPUs' intervals around a UTC midnight: 0.5 s to 3 h long (some cross it, a
    few span two), some unmeasured, some of zero length."""
    rows = []
    for g in range(draw(st.integers(1, 2))):
        t = TODAY - 2 * DAY - draw(st.integers(0, 4 * 3600 * 1000)) / 1000
        for seq in range(draw(st.integers(1, 12))):
            length = draw(st.sampled_from([0.0, 0.5, 5.0, 61.3, 3600.0, 3 * 3600.0, 30 * 3600.0]))
            busy = draw(st.one_of(st.none(), st.integers(0, int(length * 1000)).map(lambda x: x / 1000)))
            energy = draw(st.integers(0, 10**9).map(lambda x: x / 1000))
            rows.append(_gpu(f"GPU-h{g}", seq, t, t + length, busy_s=busy, energy_j=energy))
            t += length + draw(st.sampled_from([0.0, 0.0, 1.5, 7200.0]))
    return rows


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=interval_sets())
def test_rollups_equal_the_day_sums_of_the_intervals(store: ClickHouseSeries, rows: list[dict[str, Any]]) -> None:
    run_id = _run_id()
    store.write(run_id, rows, [], token=run_id)
    got = {
        (r.device_uuid, _n(r.day)): r
        for r in store.day_rollups(min(r["t0"] for r in rows), max(r["t1"] for r in rows) + 1)
        if r.run_id == run_id
    }
    want = _expected_days(rows)
    assert set(got) == set(want)
    for key, w in want.items():
        g = got[key]
        assert (g.intervals, round(g.allocated_s * 1000), round(g.energy_j * 1000)) == (
            w["intervals"],
            w["alloc"],
            w["energy"],
        )
        assert g.busy_s == (w["busy"] / 1000 if w["busy_n"] else None)
    assert sum(r.intervals for r in got.values()) == len(rows)


def test_midnight_split_matches_the_ledgers_day_sums(store: ClickHouseSeries, tmp_path: Path) -> None:
    """The same intervals in a real SQLite ledger and in the store: the ledger's interval_days
    and the store's rollups agree day by day, for an interval crossing midnight 1/4 before it."""
    run_id = _run_id()
    midnight = TODAY - DAY
    ivs = [
        GpuInterval(device_uuid="GPU-m", seq=0, t0=midnight - 100.0, t1=midnight - 20.0, busy_s=40.0, energy_j=8000.0),
        GpuInterval(device_uuid="GPU-m", seq=1, t0=midnight - 20.0, t1=midnight + 60.0, busy_s=80.0, energy_j=20000.0),
        GpuInterval(device_uuid="GPU-m", seq=2, t0=midnight + 60.0, t1=midnight + 140.0, busy_s=None, energy_j=1.5),
    ]
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger(url) as led:
        led.create_run(
            RunRecord(id=run_id, command=["x"], user="u", host="h", cwd="/", started_at=midnight - 100.0,
                      status="succeeded", ended_at=midnight + 140.0)
        )  # fmt: skip
        led.append(run_id, gpu=ivs)
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        ledger = {d["day"]: d for d in cq.interval_days(conn, [run_id], None, None)}
        rows = [dict(r) for r in conn.execute(sa.select(gpu_intervals)).mappings()]
    engine.dispose()
    for r in rows:
        del r["run_id"]
    store.write(run_id, rows, [], token=run_id)
    mine = {_n(r.day): r for r in store.day_rollups(midnight - 100, midnight + 140) if r.run_id == run_id}
    day0 = int(midnight // DAY) - 1
    assert sorted(mine) == sorted(ledger) == [day0, day0 + 1]
    # before midnight: all of seq 0 and a quarter of seq 1; after: three quarters and seq 2
    assert mine[day0].busy_s == ledger[day0]["busy_s"] == 40.0 + 20.0
    assert mine[day0 + 1].busy_s == ledger[day0 + 1]["busy_s"] == 60.0
    assert mine[day0].energy_j == ledger[day0]["energy_j"] == 8000.0 + 5000.0
    assert mine[day0 + 1].energy_j == ledger[day0 + 1]["energy_j"] == 15000.0 + 1.5
    assert (
        (mine[day0].intervals, mine[day0 + 1].intervals)
        == (ledger[day0]["intervals"], ledger[day0 + 1]["intervals"])
        == (1, 2)
    )
    assert (mine[day0].allocated_s, mine[day0 + 1].allocated_s) == (100.0, 140.0)


# -- retention ------------------------------------------------------------------------------------


def _days_run(s: ClickHouseSeries, days_ago: list[int]) -> str:
    run_id = _run_id()
    rows = [_gpu("GPU-ret", i, TODAY - d * DAY + 7200.0, TODAY - d * DAY + 7205.0) for i, d in enumerate(days_ago)]
    s.write(run_id, rows, [], token=run_id)
    return run_id


def _day(days_ago: int) -> date:
    return date(1970, 1, 1) + timedelta(days=TODAY // DAY - days_ago)


def test_drop_days_before_drops_whole_days_and_keeps_the_rollups(store: ClickHouseSeries) -> None:
    run_id = _days_run(store, [25, 12, 2])
    assert {_day(25), _day(12), _day(2)} <= set(store.raw_days())
    assert store.drop_days_before(_day(20)) >= 1
    assert _day(25) not in store.raw_days() and {_day(12), _day(2)} <= set(store.raw_days())
    assert [r["seq"] for r in store.gpu_intervals(run_id)] == [1, 2]
    rolled = {r.day for r in store.day_rollups(TODAY - 30 * DAY, TODAY + DAY) if r.run_id == run_id}
    assert rolled == {_day(25), _day(12), _day(2)}  # chargeback still has the dropped day


def test_ttl_drops_days_past_the_raw_window(tmp_path: Path) -> None:
    """A day older than the raw window is gone once the TTL is applied; when the window is
    narrowed (a new raw_days at start), create() moves the TTL and the days past it go too."""
    url = f"chdb://{tmp_path}/ttl"
    with ClickHouseSeries(url, raw_days=30) as s:
        s.create()
        run_id = _days_run(s, [20, 6, 1])
        s.expire()
        assert set(s.raw_days()) == {_day(20), _day(6), _day(1)}
    with ClickHouseSeries(url, raw_days=10) as s:
        s.create()
        s.expire()
        assert set(s.raw_days()) == {_day(6), _day(1)}
    with ClickHouseSeries(url, raw_days=3) as s:
        s.create()
        s.expire()
        assert set(s.raw_days()) == {_day(1)}
        assert [r["seq"] for r in s.gpu_intervals(run_id)] == [2]
        assert len([r for r in s.day_rollups(TODAY - 30 * DAY, TODAY) if r.run_id == run_id]) == 3


# -- bad input ------------------------------------------------------------------------------------


def test_bad_rows_are_refused_whole(store: ClickHouseSeries) -> None:
    run_id = _run_id()
    good = _gpu("GPU-bad", 0, TODAY + 10.0, TODAY + 15.0)
    before = _counts(store)
    for bad, what in (
        (_gpu("GPU-bad", 1, TODAY + 20.0, TODAY + 15.0), "t1 - t0"),
        (_gpu("GPU-bad", 1, TODAY + 20.0, TODAY + 25.0, busy_s=-1.0), "busy_s"),
        (_gpu("GPU-bad", 1, TODAY + 20.0, TODAY + 25.0, temp_max_c="hot"), "temp_max_c"),
        (_gpu("GPU-bad", 1, TODAY + 20.0, TODAY + 25.0, throttle_s={"power": None}), "throttle_s"),
        (_gpu("GPU-bad", -1, TODAY + 20.0, TODAY + 25.0), "seq"),
    ):
        with pytest.raises(BadRow, match=what):
            store.write(run_id, [good, bad], [], token=f"{run_id}:{what}")
    assert _counts(store) == before
    with pytest.raises(ValueError, match="token"):
        store.write(run_id, [good], [], token="")


@pytest.mark.parametrize(
    "url, message",
    [
        ("chdb://relative/folder", "absolute folder"),
        ("chdb:relative", "absolute folder"),
        ("clickhouse://u:secret@host:8123", "clickhouse://user:password@host:8123/database"),
        ("mysql://u:secret@host/db", "not a ClickHouse series URL"),
        ("chdb:///tmp/x?cluster=c", "cluster of ClickHouse servers"),
        ("clickhouse://u:secret@host:8123/db?cluster=a;b", "cluster of ClickHouse servers"),
    ],
)
def test_bad_url_is_a_clear_error(url: str, message: str) -> None:
    with pytest.raises(ClickHouseError, match=message) as e:
        ClickHouseSeries(url)
    assert "secret" not in str(e.value)


def test_unreachable_server_is_a_clear_error() -> None:
    """clickhouse:// to a port where nothing listens (a real refused connection on loopback)."""
    need_module("clickhouse_connect", "pip install 'gpuledger[clickhouse]'")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ClickHouseError, match=f"cannot reach ClickHouse at 127.0.0.1:{port}") as e:
        ClickHouseSeries(f"clickhouse://ana:secret@127.0.0.1:{port}/gpuledger")
    assert "secret" not in str(e.value)


@pytest.mark.parametrize("url, module", [("chdb:///tmp/x", "chdb"), ("clickhouse://h:8123/db", "clickhouse_connect")])
def test_missing_extra_names_the_install(url: str, module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # as if the package were not installed
    with pytest.raises(ClickHouseError, match=r"pip install 'gpuledger\[clickhouse\]'"):
        ClickHouseSeries(url)


def test_bytes_at_rest_counts_the_gpu_intervals(store: ClickHouseSeries) -> None:
    assert store.bytes_at_rest() == 0
    _days_run(store, [0])
    first = store.bytes_at_rest()
    _days_run(store, [1])
    assert store.bytes_at_rest() > first > 0


def test_the_ledger_does_not_load_the_extra() -> None:
    """The store is an extra: the CLI and the ledger load neither chdb nor clickhouse-connect."""
    code = (
        "import sys, gpuledger.store, gpuledger.cli.main\n"
        "print('chdb' in sys.modules, 'clickhouse_connect' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
