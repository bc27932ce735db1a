"""One run's interval series stay a timeline: rows of a GPU the run does not hold, and rows that
overlap the series' other rows, are refused one by one (store/ingest.py quarantines them).

A series is one GPU of one run (``gpu_intervals`` by ``device_uuid``) or the run's host series.
Its rows are numbered by the agent in the order it recorded them, so seq order is time order: a
new row must start no earlier than the row before it (by seq) ends, and end no later than the row
after it starts, within ``TOLERANCE_S`` (float noise; consecutive intervals share a boundary).
Checking the neighbours keeps the whole series free of overlaps, so twenty copies of one hour
under twenty seqs count once, not twenty times. Each check reads the stored rows at the push's
seqs and the one on either side (primary-key ranges), never the whole series: one statement for
all the push's series (``_NEAR_CHUNK`` at a time), a UNION ALL of three range reads per series,
built once per shape, so a push of 8 GPUs costs one round trip instead of 24.

A row already stored under its key (a resent batch), or one a rollup replaced, is passed on
unchecked: store/bulk.py drops it without a change.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store import bulk, schema

TOLERANCE_S = 1e-3
_NEAR_CHUNK = 64  # series per statement (three branches each; SQLite's limit on variables stays far)
Item = tuple[int, Sequence[Any]]  # (index in the pushed list, the row)
Refuse = Callable[[int, Sequence[Any], str], None]


def keep_timeline(
    conn: Connection,
    run_id: str,
    series: str,
    items: Sequence[Item],
    columns: Sequence[str],
    devices: set[str] | None,
    refuse: Refuse,
    *,
    marks: Mapping[str, int] | None = None,
    held: set[tuple[str, int]] | None = None,
) -> list[Item]:
    """The ``items`` of ``series`` ("gpu" or "host") that keep each of the run's series a timeline;
    ``refuse(index, row, reason)`` for each other one. ``devices``: the run's GPU UUIDs (gpu only).
    ``marks``: the series' rollup marks read already (bulk.run_marks; None: read here). ``held``:
    extended by the (device uuid or "", seq) keys of the stored rows read, which cover every seq
    of the kept items (bulk.insert_intervals then needs no read of its own)."""
    if not items:
        return []
    seq_at, t0_at, t1_at = (columns.index(c) for c in ("seq", "t0", "t1"))
    uuid_at = columns.index("device_uuid") if series == "gpu" else None
    key = (lambda r: (str(r[uuid_at]), r[seq_at])) if uuid_at is not None else (lambda r: ("", r[seq_at]))
    fresh = {id(r) for r in bulk.unreplaced(conn, run_id, series, [r for _, r in items], key, marks)}
    groups: dict[str, list[Item]] = {}
    for i, r in items:
        uuid = "" if uuid_at is None else str(r[uuid_at])
        if devices is not None and uuid not in devices:
            refuse(i, r, f"GPU {uuid} is not among the run's devices")
            continue
        groups.setdefault(uuid, []).append((i, r))
    near = _stored_near(
        conn, run_id, uuid_at is not None, {uuid: [int(r[seq_at]) for _, r in group] for uuid, group in groups.items()}
    )
    kept: list[Item] = []
    for uuid, group in groups.items():
        stored = near.get(uuid, {})
        if held is not None:
            held.update((uuid, seq) for seq in stored)
        seqs = sorted(stored)
        for i, r in sorted(group, key=lambda it: int(it[1][seq_at])):
            seq, t0, t1 = int(r[seq_at]), float(r[t0_at]), float(r[t1_at])
            if seq in stored or id(r) not in fresh:  # sent again, or rolled up: stored as it was
                kept.append((i, r))
                continue
            why = _overlap(stored, seqs, seq, t0, t1)
            if why:
                refuse(i, r, why)
                continue
            stored[seq] = (t0, t1)
            bisect.insort(seqs, seq)
            kept.append((i, r))
    return sorted(kept, key=lambda it: it[0])


def _overlap(stored: dict[int, tuple[float, float]], seqs: list[int], seq: int, t0: float, t1: float) -> str | None:
    at = bisect.bisect_left(seqs, seq)
    if at > 0:
        before = seqs[at - 1]
        b0, b1 = stored[before]
        if t0 < b1 - TOLERANCE_S:
            return f"overlaps seq {before} of the same series ({b0}-{b1}): starts at {t0}, before it ends"
    if at < len(seqs):
        after = seqs[at]
        a0, a1 = stored[after]
        if t1 > a0 + TOLERANCE_S:
            return f"overlaps seq {after} of the same series ({a0}-{a1}): ends at {t1}, after it starts"
    return None


def _stored_near(
    conn: Connection, run_id: str, gpu: bool, seqs: Mapping[str, list[int]]
) -> dict[str, dict[int, tuple[float, float]]]:
    """Per series (GPU uuid, or "" for the host series), its stored rows at seqs in [min, max] of
    its ``seqs``, and the nearest on either side: one statement per ``_NEAR_CHUNK`` series."""
    out: dict[str, dict[int, tuple[float, float]]] = {}
    streams = list(seqs.items())
    for start in range(0, len(streams), _NEAR_CHUNK):
        chunk = streams[start : start + _NEAR_CHUNK]
        params: dict[str, object] = {"run": run_id}
        for k, (uuid, s) in enumerate(chunk):
            params |= {f"u{k}": uuid, f"lo{k}": min(s), f"hi{k}": max(s)}
        for k, seq, t0, t1 in conn.execute(_near_query(gpu, len(chunk)), params):
            out.setdefault(chunk[k][0], {})[int(seq)] = (float(t0), float(t1))
    return out


@functools.lru_cache(maxsize=2 * _NEAR_CHUNK)
def _near_query(gpu: bool, n: int) -> sa.CompoundSelect:
    """The statement of ``_stored_near`` for ``n`` series, with bind parameters (run, u<k>, lo<k>,
    hi<k>): built once per shape, since building and keying it costs more than running it. Each
    row carries its series' position k."""
    table = schema.gpu_intervals if gpu else schema.host_intervals
    c = table.c
    branches = []
    for k in range(n):
        where = [c.run_id == sa.bindparam("run")] + ([c.device_uuid == sa.bindparam(f"u{k}")] if gpu else [])
        lo, hi = sa.bindparam(f"lo{k}"), sa.bindparam(f"hi{k}")
        cols = (sa.literal(k, sa.Integer).label("k"), c.seq, c.t0, c.t1)
        # the neighbours' ORDER BY ... LIMIT 1 stand in subqueries: SQLite allows them nowhere else in a UNION
        before = sa.select(*cols).where(*where, c.seq < lo).order_by(c.seq.desc()).limit(1).subquery()
        after = sa.select(*cols).where(*where, c.seq > hi).order_by(c.seq).limit(1).subquery()
        branches += [sa.select(*cols).where(*where, c.seq >= lo, c.seq <= hi), sa.select(before), sa.select(after)]
    return sa.union_all(*branches)
