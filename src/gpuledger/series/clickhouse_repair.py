"""Rollups that a killed insert left short, made whole from the raw rows (issue 38).

An insert into ``gpu_intervals`` commits the raw part first and the views' parts after it
(``gpu_day_rollups``, then ``run_day_rollups`` fed from it). A process killed in between leaves raw
rows without their rollups. Sending the same rows again with the same token would let the engine
fill just the missing view parts (``deduplicate_blocks_in_dependent_materialized_views``), but the
live server cannot rebuild that block: it leaves out the rows the store holds (``held``) and a
resend may be grouped otherwise (another push, another group commit), so another token. Tiering
(``retention run --series``) and ``db migrate --layout compact`` leave out the rows the store holds
the same way (store/series_live.lacking). Hence the repair here, which those writers run only
where ``held`` found rows (the server: rare, after a kill; tiering and the migration: the rows
live ingest or a write cut short stored):

- per (run, GPU) stream of the held rows, the days they reach are compared: the view's own SELECT
  (clickhouse_ddl.rollup_select) over the raw rows of that run and GPU against the
  ``gpu_day_rollups`` sums of the same (run, gpu, day). The raw rows read are those from the
  stream's first rollup day (or the held rows' first day) on, by the (gpu, t0) key: every row
  whose views were written starts on or after that day. Keyed by run as the table is, so other
  runs on the same GPU (other writers) never enter the comparison; a run's own pushes are
  serialised by its ledger row lock, so nothing of this run is written meanwhile;
- a rollup short of its raw rows gets the difference as one more row (a SummingMergeTree sums it
  in); its view carries it on into ``run_day_rollups``;
- then per (run, day), ``run_day_rollups`` against the sum of the run's ``gpu_day_rollups`` (the
  rows its view was fed), the difference inserted (a kill between the two views' parts);
- each repair insert's dedup token is the sha256 of what it compared (key, found, wanted): a
  repair retried on the same state is dropped, and a repair that did commit leaves nothing to
  repair next time, since the comparison then finds the sums equal.

A rollup ABOVE its raw rows is left alone and logged: the raw window (TTL, ``drop_days_before``)
has dropped rows whose rollups stay, which is not a kill's doing.

``short`` is the same comparison read only: the tier check and ``audit verify --series`` name a
tiered day whose rollups are short of its raw rows (store/series_tier.rollup_differences).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import date, timedelta
from typing import Any

from gpuledger.series.clickhouse_client import Client
from gpuledger.series.clickhouse_ddl import CHARGE_SUMS, DAY_MS, ROLLUP_SUMS, rollup_select

Row = Mapping[str, Any]
Stream = tuple[int, int]  # (run key, gpu key)
CLAUSES = 256  # streams ORed in one statement, as clickhouse_keyed.held_group
EPOCH = date(1970, 1, 1)
log = logging.getLogger(__name__)


def days_reached(rows: Sequence[Row]) -> tuple[int, int]:
    """The first and last UTC day number the rows' intervals reach (the view's days of them)."""
    first = math.floor(min(float(r["t0"]) for r in rows) * 1000)
    last = math.ceil(max(float(r["t1"]) for r in rows) * 1000)
    return first // DAY_MS, max(first, last - 1) // DAY_MS


def _iso(day: int) -> str:
    return (EPOCH + timedelta(days=day)).isoformat()


def _chunks(items: Sequence[Any]) -> list[Sequence[Any]]:
    return [items[i : i + CLAUSES] for i in range(0, len(items), CLAUSES)]


def _token(kind: str, compared: Any) -> str:
    return f"rollup-repair:{kind}:" + hashlib.sha256(json.dumps(compared, sort_keys=True).encode()).hexdigest()


def repair(
    client: Client, table: Callable[[str], str], settings: Mapping[str, Any], streams: Mapping[Stream, tuple[int, int]]
) -> int:
    """Make the rollups of ``streams`` ((run key, gpu key) -> first and last day number the held
    rows reach) equal to their raw rows, and the run × day rollups of those runs and days equal to
    the sum of their GPU day rollups. The rollup rows inserted."""
    if not streams:
        return 0
    return _gpu_days(client, table, settings, streams) + _run_days(client, table, settings, streams)


def short(
    client: Client, table: Callable[[str], str], streams: Mapping[Stream, tuple[int, int]]
) -> list[tuple[int, int | None, date, str]]:
    """What ``repair`` would add, read only (the tier check, ``audit verify --series``): (run key,
    gpu key, day, how short) per GPU rollup below its raw rows and (run key, None, day, how short)
    per run × day rollup below its GPU rollups. A rollup above is not named: a raw day the store's
    window dropped leaves its rollups (and the part of the next day's that its last row reached)."""
    if not streams:
        return []
    out: list[tuple[int, int | None, date, str]] = []
    for (r, g, d), have, want in _gpu_compared(client, table, streams):
        if any(w > h for w, h in zip(want, have, strict=True)):
            out.append((r, g, EPOCH + timedelta(days=d), _shortfall(ROLLUP_SUMS, have, want)))
    for (r, d), have, want in _run_compared(client, table, streams):
        if any(w > h for w, h in zip(want, have, strict=True)):
            out.append((r, None, EPOCH + timedelta(days=d), _shortfall(CHARGE_SUMS, have, want)))
    return out


def _shortfall(columns: Sequence[str], have: Sequence[int], want: Sequence[int]) -> str:
    """``busy_ms 1200 of 1500, ...``: each column below what it should hold."""
    return ", ".join(f"{c} {h} of {w}" for c, h, w in zip(columns, have, want, strict=True) if w > h)


def _gpu_compared(
    client: Client, table: Callable[[str], str], streams: Mapping[Stream, tuple[int, int]]
) -> list[tuple[tuple[int, int, int], list[int], list[int]]]:
    """(run, gpu, day), the ``gpu_day_rollups`` sums and the view's SELECT over the raw rows, of
    each day of ``streams`` where the two differ."""
    keys = sorted(streams)
    sums = ", ".join(f"sum({c})" for c in ROLLUP_SUMS)
    first: dict[Stream, int] = {}
    found: dict[tuple[int, int, int], list[int]] = {}
    wanted: dict[tuple[int, int, int], list[int]] = {}
    for part in _chunks(keys):
        where = " OR ".join(f"(run = {r} AND gpu = {g})" for r, g in part)
        q = f"SELECT run, gpu, toInt32(min(day)) FROM {table('gpu_day_rollups')} WHERE {where} GROUP BY run, gpu"
        for r, g, d in client.query(q):
            first[(int(r), int(g))] = int(d)
        where = " OR ".join(
            f"(run = {r} AND gpu = {g} AND day >= '{_iso(streams[(r, g)][0])}' AND day <= '{_iso(streams[(r, g)][1])}')"
            for r, g in part
        )
        q = f"SELECT run, gpu, toInt32(day), {sums} FROM {table('gpu_day_rollups')} WHERE {where} "
        q += "GROUP BY run, gpu, day"
        for r, g, d, *v in client.query(q):
            found[(int(r), int(g), int(d))] = [int(x) for x in v]
        # The raw rows of each stream from its first day (no row with views written starts earlier)
        # to the end of the last day compared, by the (gpu, t0) key; the view's SELECT over them.
        raw = " OR ".join(
            f"(gpu = {g} AND run = {r} AND t0 >= fromUnixTimestamp64Milli({min(first.get((r, g), lo), lo) * DAY_MS}, "
            f"'UTC') AND t0 < fromUnixTimestamp64Milli({(hi + 1) * DAY_MS}, 'UTC'))"
            for (r, g), (lo, hi) in ((k, streams[k]) for k in part)
        )
        source = f"(SELECT * FROM {table('gpu_intervals')} WHERE {raw})"
        q = f"SELECT run, gpu, toInt32(day), {sums} FROM ({rollup_select(source)}) GROUP BY run, gpu, day"
        for r, g, d, *v in client.query(q):
            lo, hi = streams[(int(r), int(g))]
            if lo <= int(d) <= hi:
                wanted[(int(r), int(g), int(d))] = [int(x) for x in v]
    zero = [0] * len(ROLLUP_SUMS)
    pairs = ((key, found.get(key, zero), wanted.get(key, zero)) for key in sorted(set(found) | set(wanted)))
    return [(key, have, want) for key, have, want in pairs if have != want]


def _gpu_days(
    client: Client, table: Callable[[str], str], settings: Mapping[str, Any], streams: Mapping[Stream, tuple[int, int]]
) -> int:
    rows = []
    for key, have, want in _gpu_compared(client, table, streams):
        delta = [w - h for w, h in zip(want, have, strict=True)]
        if any(x < 0 for x in delta):
            log.warning("rollup of run %s GPU %s day %s above its raw rows (raw window?): left as is", *key)
        else:
            rows.append((key, have, want, delta))
    if not rows:
        return 0
    compared = [[list(key), have, want] for key, have, want, _ in rows]
    out = [
        {"run": r, "gpu": g, "day": _iso(d), **dict(zip(ROLLUP_SUMS, delta, strict=True))}
        for (r, g, d), _, _, delta in rows
    ]
    token = {**settings, "insert_deduplication_token": _token("gpu", compared)}
    client.insert(table("gpu_day_rollups"), out, ("run", "gpu", "day", *ROLLUP_SUMS), token)
    return len(out)


def _run_compared(
    client: Client, table: Callable[[str], str], streams: Mapping[Stream, tuple[int, int]]
) -> list[tuple[tuple[int, int], list[int], list[int]]]:
    """(run, day), the ``run_day_rollups`` sums and those of the run's ``gpu_day_rollups`` (the
    rows its view was fed), of each day the runs of ``streams`` reach where the two differ."""
    spans: dict[int, tuple[int, int]] = {}
    for (r, _), (lo, hi) in streams.items():
        a, b = spans.get(r, (lo, hi))
        spans[r] = (min(a, lo), max(b, hi))
    sums = ", ".join(f"sum({c})" for c in CHARGE_SUMS)
    found: dict[tuple[int, int], list[int]] = {}
    wanted: dict[tuple[int, int], list[int]] = {}
    for part in _chunks(sorted(spans)):
        where = " OR ".join(
            f"(run = {r} AND day >= '{_iso(spans[r][0])}' AND day <= '{_iso(spans[r][1])}')" for r in part
        )
        for name, into in (("run_day_rollups", found), ("gpu_day_rollups", wanted)):
            q = f"SELECT run, toInt32(day), {sums} FROM {table(name)} WHERE {where} GROUP BY run, day"
            for r, d, *v in client.query(q):
                into[(int(r), int(d))] = [int(x) for x in v]
    zero = [0] * len(CHARGE_SUMS)
    pairs = ((key, found.get(key, zero), wanted.get(key, zero)) for key in sorted(set(found) | set(wanted)))
    return [(key, have, want) for key, have, want in pairs if have != want]


def _run_days(
    client: Client, table: Callable[[str], str], settings: Mapping[str, Any], streams: Mapping[Stream, tuple[int, int]]
) -> int:
    rows = _run_compared(client, table, streams)  # both rollups kept whole: either way the GPU days are right
    if not rows:
        return 0
    out = [
        {"day": _iso(d), "run": r, **{c: w - h for c, w, h in zip(CHARGE_SUMS, want, have, strict=True)}}
        for (r, d), have, want in rows
    ]
    token = {**settings, "insert_deduplication_token": _token("run", [[list(k), h, w] for k, h, w in rows])}
    client.insert(table("run_day_rollups"), out, ("day", "run", *CHARGE_SUMS), token)
    return len(out)
