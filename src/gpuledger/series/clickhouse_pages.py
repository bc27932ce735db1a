"""One run's raw rows from ClickHouse a page at a time (series/base.SeriesStore.gpu_page and
host_page), for readers that must not hold a whole run in memory (store/series_compact_read.py).

A GPU's page is a key range of ``gpu_intervals`` (gpu, and the t0 of the days the run's rollups
name, as ``gpu_intervals`` reads the whole run) filtered to the run and the seqs after the last
page, in seq order. ``LIMIT n WITH TIES`` keeps every row of the last seq in the page: the store
has no unique key, so a seq held twice is read twice, never split between pages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuledger.series.clickhouse_client import Client
from gpuledger.series.clickhouse_rows import GPU_SELECT, HOST_SELECT, gpu_back, host_back


def gpu_spans(client: Client, table: Callable[[str], str], run: int) -> list[list[Any]]:
    """(gpu key, first day, last day) of each GPU of the run, from its rollup rows."""
    return client.query(
        f"SELECT gpu, min(day), max(day) FROM {table('gpu_day_rollups')} WHERE run = {{r:UInt64}} GROUP BY gpu",
        {"r": run},
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
    rows = client.query(
        f"SELECT {', '.join(GPU_SELECT)} FROM {table('gpu_intervals')} "
        "WHERE gpu = {g:UInt64} AND t0 >= toDateTime64({a:String}, 3, 'UTC') "
        "AND t0 < toDateTime64({b:String}, 3, 'UTC') + INTERVAL 1 DAY AND run = {r:UInt64} "
        f"AND seq > {{s:Int64}} ORDER BY seq LIMIT {int(limit)} WITH TIES",
        {"g": gpu, "a": first, "b": last, "r": run, "s": after_seq},
    )
    return [gpu_back(device_uuid, r) for r in rows]


def host_page(
    client: Client, table: Callable[[str], str], run: int, after_seq: int, limit: int
) -> list[dict[str, Any]]:
    """The run's host rows with seq > ``after_seq``, in seq order, as ``gpu_page``."""
    rows = client.query(
        f"SELECT {', '.join(HOST_SELECT)} FROM {table('host_intervals')} WHERE run = {{r:UInt64}} "
        f"AND seq > {{s:Int64}} ORDER BY seq LIMIT {int(limit)} WITH TIES",
        {"r": run, "s": after_seq},
    )
    return [host_back(r) for r in rows]
