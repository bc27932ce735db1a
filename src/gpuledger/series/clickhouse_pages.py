"""One run's raw rows from ClickHouse a page at a time (series/base.SeriesStore.gpu_page and
host_page), for readers that must not hold a whole run in memory (store/series_compact_read.py).

A GPU's page is a key range of ``gpu_intervals`` (gpu, and the t0 of the days the run's rollups
name, as ``gpu_intervals`` reads the whole run) filtered to the run and the seqs after the last
page, in seq order. ``LIMIT n WITH TIES`` keeps every row of the last seq in the page: the store
has no unique key, so a seq held twice is read twice, never split between pages.

The seqs are bounded above too, so the raw tables' seq skip index (clickhouse_ddl.SEQ_INDEX) reads
the granules of the page's seqs, not those of every later seq (``seq > a ORDER BY seq LIMIT n``
alone reads all of them: each page would read the rest of the run, N pages O(N x rows)). The page
first reads seqs (a, a + n]; if that window holds fewer than n rows (gaps in the seqs, or the end of
the run), a window WIDEN times wider, and so on, then all seqs after a. Exact whatever the order of
seq and t0: the rows of a window are a prefix in seq order of those after a, so once it holds n
rows, its first n and the ties of the n-th (whose seq is in the window) are those of all the rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuledger.series.clickhouse_client import Client
from gpuledger.series.clickhouse_rows import GPU_SELECT, HOST_SELECT, gpu_back, host_back

WIDEN = 8  # each window this many times the last: a run with seqs 1 in k takes log8(k) + 1 reads a page
WINDOWS = 4  # bounded windows before the unbounded read: n, 8n, 64n, 512n seqs
SEQ_MAX = 2**32 - 1  # seq is a UInt32


def gpu_spans(client: Client, table: Callable[[str], str], run: int) -> list[list[Any]]:
    """(gpu key, first day, last day) of each GPU of the run, from its rollup rows."""
    return client.query(
        f"SELECT gpu, min(day), max(day) FROM {table('gpu_day_rollups')} WHERE run = {{r:UInt64}} GROUP BY gpu",
        {"r": run},
    )


def windows(after_seq: int, limit: int) -> list[int | None]:
    """The upper seq bound of each read of a page, the last None (no bound)."""
    base, out = max(after_seq, -1), []  # seqs start at 0: the first page's window starts there
    for k in range(WINDOWS):
        upto = base + limit * WIDEN**k
        if upto >= SEQ_MAX:
            break
        out.append(upto)
    return [*out, None]


def window_sql(sql: str, after_seq: int, limit: int, upto: int | None) -> tuple[str, dict[str, int]]:
    """``sql`` (a SELECT ending in its WHERE) narrowed to seqs (``after_seq``, ``upto``] in seq
    order, ``limit`` and the ties of the last; the seq parameters to bind besides ``sql``'s."""
    bound, at = ("", {"s": after_seq}) if upto is None else (" AND seq <= {u:Int64}", {"s": after_seq, "u": upto})
    return f"{sql} AND seq > {{s:Int64}}{bound} ORDER BY seq LIMIT {int(limit)} WITH TIES", at


def _paged(client: Client, sql: str, params: dict[str, Any], after_seq: int, limit: int) -> list[list[Any]]:
    """``sql`` run for the seqs after ``after_seq``, each window of ``windows`` in turn until one
    holds ``limit`` rows."""
    rows: list[list[Any]] = []
    for upto in windows(after_seq, limit):
        query, at = window_sql(sql, after_seq, limit, upto)
        rows = client.query(query, params | at)
        if len(rows) >= limit:
            break
    return rows


def gpu_page_query(table: Callable[[str], str]) -> str:
    """The SELECT of a GPU's page up to its seq condition (params g, a, b, r)."""
    return (
        f"SELECT {', '.join(GPU_SELECT)} FROM {table('gpu_intervals')} "
        "WHERE gpu = {g:UInt64} AND t0 >= toDateTime64({a:String}, 3, 'UTC') "
        "AND t0 < toDateTime64({b:String}, 3, 'UTC') + INTERVAL 1 DAY AND run = {r:UInt64}"
    )


def gpu_page(
    client: Client, table: Callable[[str], str], run: int, gpu: int, device_uuid: str, after_seq: int, limit: int
) -> list[dict[str, Any]]:
    """The run's rows of GPU ``gpu`` with seq > ``after_seq``, in seq order: the first ``limit``
    and any more of the last one's seq."""
    spans = [s for s in gpu_spans(client, table, run) if int(s[0]) == gpu]
    if not spans:
        return []
    _, first, last = spans[0]
    params = {"g": gpu, "a": first, "b": last, "r": run}
    return [gpu_back(device_uuid, r) for r in _paged(client, gpu_page_query(table), params, after_seq, limit)]


def host_page(
    client: Client, table: Callable[[str], str], run: int, after_seq: int, limit: int
) -> list[dict[str, Any]]:
    """The run's host rows with seq > ``after_seq``, in seq order, as ``gpu_page``."""
    sql = f"SELECT {', '.join(HOST_SELECT)} FROM {table('host_intervals')} WHERE run = {{r:UInt64}}"
    return [host_back(r) for r in _paged(client, sql, {"r": run}, after_seq, limit)]
