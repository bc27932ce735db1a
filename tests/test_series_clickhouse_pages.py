"""The ClickHouse store's pages of a run by seq (series/clickhouse_pages.py) read the granules of
their own seqs through the raw tables' seq skip index (clickhouse_ddl.SEQ_INDEX), not the GPU's
whole run again for every page; and stay exact where seqs do not follow t0, repeat or jump.

What a read costs is the engine's own count of the granules (marks) its queries selected after
every index (``SelectedMarks`` in ``system.events``), taken around the store's call."""

from __future__ import annotations

import json
import random
import time
from typing import Any

from gpuledger.series import clickhouse_pages
from gpuledger.series.clickhouse import ClickHouseSeries
from gpuledger.store import series_compact_read, series_tier
from server_support import gpu_rows, host_rows

NOW = time.time() - 30 * 86400  # inside the fixture's ten-year raw window
N = 60_000  # rows of the GPU: 5 s apart, some 3.5 days, 8 granules of 8,192 and more
GPU_UUID = str(gpu_rows(1)[0]["device_uuid"])


def _gpu(n: int, **kw: Any) -> list[dict[str, Any]]:
    return [{c: r.get(c) for c in series_tier.GPU_COLUMNS} for r in gpu_rows(n, start=NOW, **kw)]


def _host(n: int, **kw: Any) -> list[dict[str, Any]]:
    return [{c: r.get(c) for c in series_tier.HOST_COLUMNS} for r in host_rows(n, start=NOW, **kw)]


def _marks(store: ClickHouseSeries) -> int:
    """Granules the engine's reads have selected so far (after the primary key and skip indexes)."""
    rows = store.client.query("SELECT value FROM system.events WHERE event = 'SelectedMarks'")
    return int(rows[0][0]) if rows else 0


def _cost(store: ClickHouseSeries, read: Any) -> tuple[Any, int]:
    before = _marks(store)
    got = read()
    return got, _marks(store) - before


def test_a_page_reads_the_granules_of_its_seqs_not_the_whole_run(chdb_series: ClickHouseSeries) -> None:
    store = chdb_series
    gpu, uuid = _gpu(N), GPU_UUID
    for at in range(0, N, 10_000):  # as an agent pushes: a part per batch and day, merged later
        store.write("r1", gpu[at : at + 10_000], _host(10_000, first_seq=at), token=f"b{at}")
    whole, whole_marks = _cost(store, lambda: store.gpu_intervals("r1", uuid))
    assert len(whole) == N and whole_marks >= 8

    for after in (-(2**31), 999, 30_000, N - 2_000):
        page, marks = _cost(store, lambda a=after: store.gpu_page("r1", uuid, a, 1000))
        first = max(after, -1) + 1
        assert [r["seq"] for r in page] == list(range(first, first + 1000))
        # 1,000 seqs lie in one granule or two (and the rollups' few): not the GPU's 8 and more
        assert marks <= whole_marks // 2, (after, marks, whole_marks)
        hosts, host_marks = _cost(store, lambda a=after: store.host_page("r1", a, 1000))
        assert [r["seq"] for r in hosts] == list(range(first, first + 1000))
        assert host_marks <= 4, (after, host_marks)

    # the last page: the bounded windows find fewer rows than the limit, then all seqs after it
    tail, marks = _cost(store, lambda: store.gpu_page("r1", uuid, N - 500, 1000))
    assert [r["seq"] for r in tail] == list(range(N - 499, N))
    assert marks <= len(clickhouse_pages.windows(N - 500, 1000)) * 2 + 1  # the last granule or two, once a read

    # the plan names the index: of the GPU's granules in the run's days, those of the page's seqs
    sql, at = clickhouse_pages.window_sql(clickhouse_pages.gpu_page_query(store.layout.table), 30_000, 1000, 31_000)
    (first_day, last_day), key = (
        store.client.query(f"SELECT min(day), max(day) FROM {store.layout.table('gpu_day_rollups')}")[0],
        {"g": store._key("gpu", uuid), "r": store._key("run", "r1")},
    )
    plan = store.client.query(f"EXPLAIN json = 1, indexes = 1 {sql}", {**key, "a": first_day, "b": last_day, **at})
    indexes = _read_indexes(json.loads("".join(str(r[0]) for r in plan)))
    (primary,) = [i for i in indexes if i["Type"] == "PrimaryKey"]
    (skip,) = [i for i in indexes if i["Type"] == "Skip"]
    assert skip["Name"] == "seq_idx" and skip["Selected Granules"] <= 2 < 8 <= primary["Selected Granules"]


def _read_indexes(node: Any) -> list[dict[str, Any]]:
    """The ``Indexes`` of the plan's ReadFromMergeTree step."""
    if isinstance(node, list):
        return [i for n in node for i in _read_indexes(n)]
    if not isinstance(node, dict):
        return []
    if node.get("Node Type") == "ReadFromMergeTree":
        return list(node.get("Indexes", []))
    return [i for v in node.values() for i in _read_indexes(v)]


def test_pages_are_exact_where_seqs_jump_repeat_and_run_against_time(chdb_series: ClickHouseSeries) -> None:
    """Seqs far apart (every bounded window short: the unbounded read), a seq held twice (never split
    between pages) and seqs that do not follow t0 (a re-pushed or renumbered row): paged through, the
    run's rows are those read whole, for every page size."""
    store = chdb_series
    rnd = random.Random(7)
    gpu = _gpu(120)
    seqs = rnd.sample(range(10**6), 120)  # not in t0's order
    for r, s in zip(gpu, seqs, strict=True):
        r["seq"] = s
    host = _host(120)
    for r, s in zip(host, seqs, strict=True):
        r["seq"] = s
    store.write("r1", gpu, host, token="one")
    store.write("r1", gpu[5:9], host[5:9], token="again")  # held twice: no unique key drops them
    # another run on the GPU at the same times: one seq in five, the last first (a wider window)
    late = [dict(r, seq=5 * (199 - i)) for i, r in enumerate(_gpu(200))]
    store.write("r2", late, [dict(r, seq=5 * (199 - i)) for i, r in enumerate(_host(200))], token="late")
    for run, n in (("r1", 124), ("r2", 200)):
        whole, host_whole = store.gpu_intervals(run), store.host_intervals(run)
        assert len(whole) == len(host_whole) == n
        for size in (3, 40, 1000):
            paged = [r for page in series_compact_read.store_gpu_pages(store, run, GPU_UUID, size) for r in page]
            assert paged == whole, (run, size)
            pages = list(series_compact_read.store_host_pages(store, run, size))
            assert [r for p in pages for r in p] == host_whole, (run, size)
            held = [{r["seq"] for r in p} for p in pages]
            assert sum(map(len, held)) == len(set().union(*held)), size  # no seq split between two pages


def test_a_store_made_before_the_index_gets_it_on_open(chdb_series: ClickHouseSeries) -> None:
    """An older store (its raw tables without seq_idx, parts written then): ``create()`` adds the
    index, once; the old parts (no index in them) are read whole and pages stay exact."""
    store = chdb_series
    for name in ("gpu_intervals", "host_intervals"):
        store.client.command(f"ALTER TABLE {store.layout.local(name)} DROP INDEX seq_idx")
    assert _indexes(store) == []
    store.write("r1", _gpu(500), _host(500), token="old")
    store.create()
    store.create()  # again: nothing more to add
    assert _indexes(store) == [["gpu_intervals", "seq_idx", "minmax"], ["host_intervals", "seq_idx", "minmax"]]
    store.write("r1", _gpu(500, first_seq=500), _host(500, first_seq=500), token="new")
    whole = store.gpu_intervals("r1")
    assert [r for page in series_compact_read.store_gpu_pages(store, "r1", GPU_UUID, 70) for r in page] == whole
    assert [r["seq"] for r in store.host_page("r1", 480, 40)] == list(range(481, 521))


def _indexes(store: ClickHouseSeries) -> list[list[Any]]:
    return store.client.query(
        "SELECT table, name, type FROM system.data_skipping_indices WHERE database = {db:String} ORDER BY table",
        {"db": store.layout.database},
    )
