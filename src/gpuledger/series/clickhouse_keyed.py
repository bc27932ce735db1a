"""Reads of the ClickHouse raw-interval store that go by its sort keys, ``(gpu, t0)`` and
``(run, t0)`` (series/clickhouse_ddl.py), never a scan of a table: which rows of a batch the store
already holds (store/series_live.py), and a run's rows in a time window (paged ``/intervals``,
store/series_read.py). Used by series/clickhouse.py, which hands in the client, table names and keys.

A window read cannot know where the rows reaching into the window start: an interval lasts at
most ``MAX_DUR_MS`` (``dur_ms`` is UInt32, series/clickhouse_rows.py refuses longer), so the key
range starts that long before the window (clipped to the run's first day for GPU rows), as the
compact PostgreSQL store bounds it by its int4 duration (series/postgres.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuledger.series.clickhouse_client import Client

Row = Mapping[str, Any]
MAX_DUR_MS = 2**32 - 1  # the longest interval the store keeps (dur_ms UInt32)
DAY_MS = 86_400_000
LAST_MS = 10_413_792_000_000  # 2300-01-01: past the last time DateTime64(3) holds
_T0_IN = "t0 >= fromUnixTimestamp64Milli({a:Int64}, 'UTC') AND t0 <= fromUnixTimestamp64Milli({b:Int64}, 'UTC')"


def _ms_range(rows: Sequence[Row]) -> dict[str, int]:
    """The ms range covering the batch's t0s (rounded outwards: a float's ms is never missed)."""
    return {
        "a": math.floor(min(float(r["t0"]) for r in rows) * 1000),
        "b": math.ceil(max(float(r["t0"]) for r in rows) * 1000),
    }


def held(
    client: Client,
    table: Callable[[str], str],
    run: int,
    gpus: Mapping[str, int],
    gpu: Sequence[Row],
    host: Sequence[Row],
) -> tuple[set[tuple[str, int]], set[int]]:
    """The (device, seq) of ``gpu`` and the seqs of ``host`` that run ``run`` already has in the
    store (``gpus``: device -> its key), read by key: the batch's (gpu, t0) and (run, t0) ranges."""
    gpu_held: set[tuple[str, int]] = set()
    host_held: set[int] = set()
    if gpu:
        names = {k: n for n, k in gpus.items()}
        rows = client.query(
            f"SELECT gpu, seq FROM {table('gpu_intervals')} WHERE gpu IN {{g:Array(UInt64)}} AND {_T0_IN} "
            "AND run = {r:UInt64}",
            {"g": sorted(names), "r": run, **_ms_range(gpu)},
        )
        gpu_held = {(names[int(g)], int(s)) for g, s in rows if int(g) in names}
    if host:
        rows = client.query(
            f"SELECT seq FROM {table('host_intervals')} WHERE run = {{r:UInt64}} AND {_T0_IN}",
            {"r": run, **_ms_range(host)},
        )
        host_held = {int(s) for (s,) in rows}
    return gpu_held, host_held
