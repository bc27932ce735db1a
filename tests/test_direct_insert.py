"""The SQLite flush on the DBAPI cursor stores exactly what SQLAlchemy's executemany stores.

``Database.insert_new_rows`` (store/direct_insert.py) and the recorder's flush into an open run
(store/flush.py) skip SQLAlchemy's per-statement machinery on SQLite; a record stored that way
must be byte for byte the record SQLAlchemy would have stored: NaN readings as NULL, throttle and
payload dicts as JSON, NaN metric values kept, booleans, big ints. What the flush may not take
(an ended run, events to number) still goes through writes.append.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuledger.core.ids import uuid7
from gpuledger.core.model import Event, GpuInterval, HostInterval, Metric, RunRecord
from gpuledger.store import Ledger, schema, writes
from gpuledger.store.codec import to_row
from gpuledger.store.errors import RunNotFound

_IDS = itertools.count(1)

reading = st.none() | st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**53), 2**53).map(float)
count = st.none() | st.integers(0, 2**62)
text = st.none() | st.text(max_size=12)
throttle = st.none() | st.dictionaries(st.text(max_size=8), st.floats(allow_nan=True), max_size=4)


@st.composite
def gpu_intervals(draw: Any) -> list[GpuInterval]:
    n = draw(st.integers(1, 6))
    return [
        GpuInterval(
            device_uuid=draw(st.sampled_from(["GPU-a", "GPU-b"])),
            seq=i,
            t0=1.7e9 + i,
            t1=1.7e9 + i + 1,
            samples=draw(st.integers(0, 100)),
            busy_s=draw(reading),
            util_method=draw(text),
            util_max_pct=draw(reading),
            util_idle_s=draw(reading),
            util_unknown_s=draw(reading),
            energy_j=draw(reading),
            energy_method=draw(text),
            power_max_w=draw(reading),
            mem_used_max_b=draw(count),
            mem_used_last_b=draw(count),
            mem_reserved_b=draw(count),
            proc_mem_max_b=draw(count),
            proc_sm_util_avg_pct=draw(reading),
            proc_method=draw(text),
            temp_max_c=draw(reading),
            sm_clock_avg_mhz=draw(reading),
            mem_clock_max_mhz=draw(reading),
            throttle_s=draw(throttle),
        )
        for i in range(n)
    ]


@st.composite
def host_intervals(draw: Any) -> list[HostInterval]:
    return [
        HostInterval(
            seq=i,
            t0=1.7e9 + i,
            t1=1.7e9 + i + 1,
            cpu_s=draw(st.floats(0, 1e6)),
            rss_max_b=draw(st.integers(0, 2**50)),
            read_b=draw(st.integers(0, 2**62)),
            write_b=draw(st.integers(0, 2**62)),
            threads_max=draw(st.integers(0, 999)),
            procs_max=draw(st.integers(0, 99)),
            sys_cpu_util_avg_pct=draw(reading),
            iowait_s=draw(reading),
            sys_mem_used_max_b=draw(count),
            disk_read_b=draw(count),
            net_tx_b=draw(count),
        )
        for i in range(draw(st.integers(1, 4)))
    ]


payload = st.dictionaries(
    st.text(max_size=6), st.none() | st.booleans() | st.floats(allow_nan=True) | st.text(max_size=20), max_size=4
)
events = st.lists(st.builds(Event, t=st.floats(1e9, 2e9), kind=st.text(max_size=8), message=st.text(max_size=30),
                            payload=payload), min_size=1, max_size=4)  # fmt: skip
metrics = st.lists(st.builds(Metric, t=st.floats(1e9, 2e9), key=st.text(min_size=1, max_size=8),
                             value=st.floats(allow_nan=True, allow_infinity=True),
                             epoch=st.none() | st.integers(0, 999), step=st.none() | st.integers(0, 2**40)),
                   min_size=1, max_size=4)  # fmt: skip


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Ledger:
    led = Ledger(f"sqlite:///{tmp_path_factory.mktemp('direct') / 'ledger.db'}")
    yield led
    led.close()


def _new_run(ledger: Ledger) -> str:
    run = RunRecord(id=uuid7(1_700_000_000_000 + next(_IDS)), command=["x"], user="u", host="h", cwd="/",
                    started_at=1.7e9, interval_s=5.0)  # fmt: skip
    ledger.create_run(run)
    return run.id


def _stored(ledger: Ledger, table: sa.Table, run_id: str) -> list[tuple[Any, ...]]:
    """The raw stored values (no result processing), run_id left out, NaN made comparable."""
    cols = [c.name for c in table.columns if c.name != "run_id"]
    sql = f"SELECT {', '.join(cols)} FROM {table.name} WHERE run_id = ? ORDER BY {', '.join(cols)}"
    rows = ledger._db.read(lambda conn: conn.exec_driver_sql(sql, (run_id,)).fetchall())
    return [tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in row) for row in rows]


def _both_ways(ledger: Ledger, table: sa.Table, rows_for: Any) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    db = ledger._db
    direct, through_sa = _new_run(ledger), _new_run(ledger)
    db.write(lambda conn: db.insert_new_rows(conn, table, rows_for(direct)))
    db.write(lambda conn: conn.execute(db.insert_new(table), rows_for(through_sa)))
    assert db.direct._plans, "the SQLite path did not run on the DBAPI cursor"
    assert all(plan is not None for plan in db.direct._plans.values())
    return _stored(ledger, table, direct), _stored(ledger, table, through_sa)


_settings = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_settings
@given(gpu_intervals())
def test_gpu_intervals_are_stored_as_sqlalchemy_stores_them(ledger: Ledger, intervals: list[GpuInterval]) -> None:
    direct, through_sa = _both_ways(ledger, schema.gpu_intervals, lambda r: [to_row(i, run_id=r) for i in intervals])
    assert direct == through_sa
    assert len(direct) == len(intervals)


@_settings
@given(host_intervals())
def test_host_intervals_are_stored_as_sqlalchemy_stores_them(ledger: Ledger, intervals: list[HostInterval]) -> None:
    direct, through_sa = _both_ways(ledger, schema.host_intervals, lambda r: [to_row(i, run_id=r) for i in intervals])
    assert direct == through_sa


@_settings
@given(events)
def test_events_are_stored_as_sqlalchemy_stores_them(ledger: Ledger, evs: list[Event]) -> None:
    def rows(run_id: str) -> list[dict[str, Any]]:
        return [{**to_row(e, run_id=run_id), "seq": i} for i, e in enumerate(evs)]

    direct, through_sa = _both_ways(ledger, schema.events, rows)
    assert direct == through_sa


@_settings
@given(metrics)
def test_metric_values_nan_included_are_stored_as_sqlalchemy_stores_them(ledger: Ledger, ms: list[Metric]) -> None:
    def rows(run_id: str) -> list[dict[str, Any]]:
        return [{**to_row(m, run_id=run_id), "seq": i} for i, m in enumerate(ms)]

    direct, through_sa = _both_ways(ledger, schema.metrics, rows)
    assert direct == through_sa


def test_a_nan_reading_is_stored_as_null_and_a_throttle_dict_as_json(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    run_id = _new_run(ledger)
    gi = GpuInterval(device_uuid="GPU-a", seq=0, t0=1.0, t1=2.0, busy_s=float("nan"), throttle_s={"power": 0.5})
    ledger.append(run_id, gpu=[gi])
    (row,) = _stored(ledger, schema.gpu_intervals, run_id)
    names = [c.name for c in schema.gpu_intervals.columns if c.name != "run_id"]
    stored = dict(zip(names, row, strict=True))
    assert stored["busy_s"] is None
    assert stored["throttle_s"] == '{"power": 0.5}'
    (back,) = ledger.gpu_intervals(run_id)
    assert back.throttle_s == {"power": 0.5} and back.busy_s is None
    ledger.close()


def test_a_resent_flush_adds_nothing_and_fewer_columns_leave_the_rest_null(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    run_id = _new_run(ledger)
    batch = [GpuInterval(device_uuid="GPU-a", seq=i, t0=float(i), t1=i + 1.0, busy_s=0.5) for i in range(3)]
    ledger.append(run_id, gpu=batch)
    ledger.append(run_id, gpu=batch)  # a retry after a lost reply: ON CONFLICT DO NOTHING
    assert [i.seq for i in ledger.gpu_intervals(run_id)] == [0, 1, 2]
    db = ledger._db
    few = [{"run_id": run_id, "device_uuid": "GPU-a", "seq": s, "t0": 9.0, "t1": 10.0, "samples": 1} for s in (7, 8)]
    db.write(lambda conn: db.insert_new_rows(conn, schema.gpu_intervals, few))
    stored = ledger.gpu_intervals(run_id)
    assert [i.seq for i in stored] == [0, 1, 2, 7, 8]
    assert stored[-1].busy_s is None and stored[-1].throttle_s is None
    mixed = [to_row(batch[0], run_id=run_id) | {"seq": 10}, few[0] | {"seq": 9}]
    with pytest.raises(sa.exc.StatementError):  # as SQLAlchemy refuses it: one column set per executemany
        db.write(lambda conn: db.insert_new_rows(conn, schema.gpu_intervals, mixed))
    ledger.close()


def test_a_flush_into_a_run_deleted_meanwhile_is_refused_as_before(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    recorder, other = Ledger(url), Ledger(url)
    run_id = _new_run(recorder)
    gi = GpuInterval(device_uuid="GPU-a", seq=0, t0=1.0, t1=2.0, busy_s=0.5)
    recorder.append(run_id, gpu=[gi])  # the run is now known: no look-up before the next flush
    other.delete_run(run_id)
    with pytest.raises(RunNotFound):
        recorder.append(run_id, gpu=[GpuInterval(device_uuid="GPU-a", seq=1, t0=2.0, t1=3.0)])
    recorder.close()
    other.close()


class _Spy:
    """writes.append, counted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = writes.append

        def spy(*args: Any, **kwargs: Any) -> None:
            self.calls += 1
            real(*args, **kwargs)

        monkeypatch.setattr(writes, "append", spy)


def _some_intervals() -> tuple[list[GpuInterval], list[HostInterval]]:
    gpu = [
        GpuInterval(device_uuid=u, seq=s, t0=1.7e9 + s, t1=1.7e9 + s + 5, busy_s=2.5, util_method="samples",
                    energy_j=900.0, throttle_s={"power": 0.25}, util_unknown_s=float("nan"))
        for u in ("GPU-a", "GPU-b") for s in range(2)
    ]  # fmt: skip
    host = [HostInterval(seq=0, t0=1.7e9, t1=1.7e9 + 5, cpu_s=3.0, rss_max_b=2**30, iowait_s=0.1)]
    return gpu, host


def test_the_recorders_flush_into_an_open_run_skips_the_general_path_and_stores_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    gpu, host = _some_intervals()
    general = _new_run(ledger)
    db = ledger._db
    db.write(lambda conn: writes.append(db, conn, general, gpu, host, [], [], None, None))
    spy = _Spy(monkeypatch)
    direct = _new_run(ledger)
    ledger.append(direct, gpu, host)
    ledger.append(direct, gpu, host)  # sent again: nothing added
    assert spy.calls == 0, "an open run's flush went through SQLAlchemy's general path"
    for table in (schema.gpu_intervals, schema.host_intervals):
        assert _stored(ledger, table, direct) == _stored(ledger, table, general)
    assert len(ledger.gpu_intervals(direct)) == 4
    ledger.close()


def test_a_flush_into_an_ended_run_or_with_events_goes_the_general_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    gpu, host = _some_intervals()
    spy = _Spy(monkeypatch)
    open_run = _new_run(ledger)
    ledger.append(open_run, gpu[:1], events=[Event(t=1.7e9, kind="epoch_end", message="1")])
    assert spy.calls == 1  # events are numbered by the general path
    ended = _new_run(ledger)
    ledger.update_run(ended, status="succeeded", ended_at=1.7e9 + 60)
    ledger.append(ended, gpu, host)  # a late replay: rollups may need dropping, the general path decides
    assert spy.calls == 2
    assert len(ledger.gpu_intervals(ended)) == 4
    ledger.close()
