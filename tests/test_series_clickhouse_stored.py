"""What ``ClickHouseSeries.write()`` returns, the rows its call stored, read without counting the
batch's rows in the table where the engine can say it (chDB: the process's count of blocks dropped
as duplicates, read around the insert), and counted where it cannot (a server over HTTP, or a batch
over two UTC days, whose blocks are stored or dropped one by one). Both give the same figure.
"""

from __future__ import annotations

from typing import Any

import pytest

from ci_support import need_module

need_module("chdb", "pip install 'gpuledger[clickhouse]'")

from gpuledger.series.clickhouse import ClickHouseSeries  # noqa: E402

MIDNIGHT = 1_780_012_800  # 2026-05-29 00:00 UTC


@pytest.fixture
def store(chdb_series: ClickHouseSeries) -> ClickHouseSeries:
    return chdb_series


def _gpu(seq: int, t0: float) -> dict[str, Any]:
    return {"device_uuid": "GPU-s", "seq": seq, "t0": t0, "t1": t0 + 5, "samples": 5, "busy_s": 1.0}


def _host(seq: int, t0: float) -> dict[str, Any]:
    return {"seq": seq, "t0": t0, "t1": t0 + 5, "samples": 5, "cpu_s": 1.0, "rss_max_b": 1, "read_b": 0,
            "write_b": 0, "threads_max": 1, "procs_max": 1}  # fmt: skip


def _rows(store: ClickHouseSeries) -> int:
    return int(store.client.query(f"SELECT count() FROM {store.layout.table('gpu_intervals')}")[0][0])


@pytest.mark.parametrize("tells", [True, False], ids=["told by the engine", "counted"])
def test_stored_new_resent_and_half_resent(
    store: ClickHouseSeries, tells: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store.client, "tells_duplicates", tells)
    day = [_gpu(i, MIDNIGHT - 600.0 + 5 * i) for i in range(10)]
    assert store.write("run-s", day, [_host(0, MIDNIGHT - 600.0)], "run-s:a") == 11
    assert store.write("run-s", day, [_host(0, MIDNIGHT - 600.0)], "run-s:a") == 0
    # A batch over midnight is two blocks: one stored before a kill, the other not, until the resend.
    before = [_gpu(100 + i, MIDNIGHT - 30.0 + 5 * i) for i in range(6)]
    after = [_gpu(106 + i, MIDNIGHT + 5.0 * i) for i in range(4)]
    assert store.write("run-s", before, [], "run-s:b") == 6
    assert store.write("run-s", before + after, [], "run-s:b") == 4
    assert store.write("run-s", before + after, [], "run-s:b") == 0
    assert _rows(store) == 20


def test_the_engine_tells_without_counting(store: ClickHouseSeries, monkeypatch: pytest.MonkeyPatch) -> None:
    """On chDB a batch of one day is stored with one statement more than its insert, not two counts."""
    seen: list[str] = []
    query = store.client.query
    monkeypatch.setattr(store.client, "query", lambda sql, params=None: seen.append(sql) or query(sql, params))
    rows = [_gpu(i, MIDNIGHT + 5.0 * i) for i in range(10)]
    assert store.write("run-t", rows, [], "run-t:0") == 10
    assert store.write("run-t", rows, [], "run-t:0") == 0
    assert seen == []


def test_a_stream_of_writes_reads_the_count_once_each(store: ClickHouseSeries, monkeypatch: pytest.MonkeyPatch) -> None:
    store.write("run-u", [_gpu(0, MIDNIGHT)], [], "run-u:0")  # keys registered, the count read
    calls: list[str] = []
    session = store.client._session  # type: ignore[attr-defined]
    real = session.query
    monkeypatch.setattr(session, "query", lambda sql, *a, **kw: calls.append(sql) or real(sql, *a, **kw))
    for i in range(1, 4):
        assert store.write("run-u", [_gpu(i, MIDNIGHT + 5.0 * i)], [], f"run-u:{i}") == 1
    assert [c.split()[0] for c in calls] == ["INSERT", "SELECT"] * 3  # the insert and the count after it


def test_a_statement_between_two_writes_makes_the_next_read_the_count_anew(store: ClickHouseSeries) -> None:
    """Another statement may drop a block too (an INSERT ... SELECT of rows already stored): the
    count read after the last write no longer stands for the count before the next."""
    first = [_gpu(i, MIDNIGHT + 5.0 * i) for i in range(3)]
    assert store.write("run-v", first, [], "run-v:0") == 3
    again = f"SELECT * FROM {store.layout.table('gpu_intervals')} WHERE seq < 3"
    store.client.query(
        f"INSERT INTO {store.layout.table('gpu_intervals')} SETTINGS insert_deduplication_token = 'run-v:0:gpu' {again}"
    )  # dropped by the engine: a duplicate block
    assert store.write("run-v", [_gpu(3, MIDNIGHT + 15.0)], [], "run-v:1") == 1
    assert _rows(store) == 4
