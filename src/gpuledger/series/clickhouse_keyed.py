"""Reads of the ClickHouse raw-interval store that go by its sort keys, ``(gpu, t0)`` and
``(run, t0)`` (series/clickhouse_ddl.py), never a scan of a table: which rows of a batch the store
already holds (store/series_live.py; ``held_group``: a whole group commit's batches in one
statement, store/series_batch.py), and a run's rows in a time window (paged ``/intervals``,
store/series_read.py). Used by series/clickhouse.py, which hands in the client, table names and keys.

A window read cannot know where the rows reaching into the window start: an interval lasts at
most ``MAX_DUR_MS`` (``dur_ms`` is UInt32, series/clickhouse_rows.py refuses longer), so the key
range starts that long before the window (clipped to the run's first day for GPU rows), as the
compact PostgreSQL store bounds it by its int4 duration (series/postgres.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import date
from typing import Any

from gpuledger.series.clickhouse_client import Client
from gpuledger.series.clickhouse_rows import GPU_SELECT, HOST_SELECT, gpu_back, host_back

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


GROUP_CLAUSES = 256  # key ranges ORed in one statement (a few hundred bytes each, well within max_query_size)


def _ms_text(rows: Sequence[Row]) -> str:
    r = _ms_range(rows)
    return (
        f"t0 >= fromUnixTimestamp64Milli({int(r['a'])}, 'UTC') AND t0 <= fromUnixTimestamp64Milli({int(r['b'])}, 'UTC')"
    )


def held_group(
    client: Client,
    table: Callable[[str], str],
    batches: Sequence[tuple[int, Mapping[str, int], Sequence[Row], Sequence[Row]]],
) -> list[tuple[set[tuple[str, int]], set[int]]]:
    """``held`` for many runs' batches at once ((run key, device -> key, gpu rows, host rows) each),
    per batch in order: one statement per table (per GROUP_CLAUSES batches), its WHERE the batches'
    key ranges ORed, so the engine still reads each batch's (gpu, t0) and (run, t0) ranges only.
    The keys and times are integers computed here, written into the statement as numbers.
    Each run once: its batches joined first."""
    if len({run for run, *_ in batches}) < len(batches):
        raise ValueError("held_group takes each run once (join its batches first)")
    out: list[tuple[set[tuple[str, int]], set[int]]] = [(set(), set()) for _ in batches]
    gpu_at = {(run, key): i for i, (run, gpus, rows, _) in enumerate(batches) if rows for key in gpus.values()}
    host_at = {run: i for i, (run, _, _, rows) in enumerate(batches) if rows}
    names = [{k: n for n, k in gpus.items()} for _, gpus, _, _ in batches]
    gpu_where = [
        f"(run = {int(run)} AND gpu IN ({', '.join(str(int(k)) for k in sorted(gpus.values()))}) AND {_ms_text(rows)})"
        for run, gpus, rows, _ in batches
        if rows
    ]
    host_where = [f"(run = {int(run)} AND {_ms_text(rows)})" for run, _, _, rows in batches if rows]
    for i in range(0, len(gpu_where), GROUP_CLAUSES):
        where = " OR ".join(gpu_where[i : i + GROUP_CLAUSES])
        for run, g, s in client.query(f"SELECT run, gpu, seq FROM {table('gpu_intervals')} WHERE {where}"):
            at = gpu_at.get((int(run), int(g)))
            if at is not None:
                out[at][0].add((names[at][int(g)], int(s)))
    for i in range(0, len(host_where), GROUP_CLAUSES):
        where = " OR ".join(host_where[i : i + GROUP_CLAUSES])
        for run, s in client.query(f"SELECT run, seq FROM {table('host_intervals')} WHERE {where}"):
            at = host_at.get(int(run))
            if at is not None:
                out[at][1].add(int(s))
    return out


def _window(t_from: float, t_to: float, first_ms: int = 0) -> dict[str, int]:
    """The key range [a, b) of t0 (ms) whose rows can overlap the window, and the overlap test's
    bound f, each wider than exact by a ms (the exact test runs on the decoded rows, as the
    whole read's rows would be filtered), clamped to the times DateTime64(3) holds."""
    f = math.floor(t_from * 1000) - 1
    a = max(f - MAX_DUR_MS, first_ms, 0)
    b = min(max(math.ceil(t_to * 1000) + 1, 0), LAST_MS)
    return {"a": min(a, LAST_MS), "b": b, "f": max(min(f, 2**62), -(2**62))}


def _finite(t_from: float, t_to: float) -> None:
    if not (math.isfinite(t_from) and math.isfinite(t_to)):
        raise ValueError(f"a window needs finite bounds, not {t_from!r}..{t_to!r}")


def _in(r: dict[str, Any], t_from: float, t_to: float) -> bool:
    return r["t1"] > t_from and r["t0"] < t_to


_OVERLAPS = (
    "t0 >= fromUnixTimestamp64Milli({a:Int64}, 'UTC') AND t0 < fromUnixTimestamp64Milli({b:Int64}, 'UTC') "
    "AND toUnixTimestamp64Milli(t0) + dur_ms > {f:Int64}"
)


def gpu_between(
    client: Client,
    table: Callable[[str], str],
    run: int,
    spans: Sequence[tuple[int, str, str]],
    names: Mapping[int, str],
    t_from: float,
    t_to: float,
) -> list[dict[str, Any]]:
    """The run's GPU rows with t1 > ``t_from`` and t0 < ``t_to``, in (device, seq) order: per GPU
    of ``spans`` ((gpu key, first day, last day) of the run's rollups) its (gpu, t0) key range."""
    _finite(t_from, t_to)
    out: list[dict[str, Any]] = []
    for gpu, first, _last in spans:
        p = _window(t_from, t_to, _day_ms(first))
        rows = client.query(
            f"SELECT {', '.join(GPU_SELECT)} FROM {table('gpu_intervals')} "
            f"WHERE gpu = {{g:UInt64}} AND {_OVERLAPS} AND run = {{r:UInt64}} ORDER BY seq",
            {"g": int(gpu), "r": run, **p},
        )
        out += [r for r in (gpu_back(names[int(gpu)], v) for v in rows) if _in(r, t_from, t_to)]
    out.sort(key=lambda r: (r["device_uuid"], r["seq"]))
    return out


def host_between(
    client: Client, table: Callable[[str], str], run: int, t_from: float, t_to: float
) -> list[dict[str, Any]]:
    """The run's host rows with t1 > ``t_from`` and t0 < ``t_to``, in seq order, by (run, t0)."""
    _finite(t_from, t_to)
    p = _window(t_from, t_to)
    rows = client.query(
        f"SELECT {', '.join(HOST_SELECT)} FROM {table('host_intervals')} "
        f"WHERE run = {{r:UInt64}} AND {_OVERLAPS} ORDER BY seq",
        {"r": run, **p},
    )
    return [r for r in (host_back(v) for v in rows) if _in(r, t_from, t_to)]


def _day_ms(day: str) -> int:
    """A rollup's day (YYYY-MM-DD) as the ms of its UTC midnight (no row of the run starts before)."""
    return (date.fromisoformat(day) - date(1970, 1, 1)).days * DAY_MS
