"""Runs whose raw intervals only the series store holds (``serve --series URL --series-only``).

The ledger keeps no interval rows for such a run (schema_series_only.py): per stream (a GPU of the
run, or its host stream under ``device_uuid = ''``) it keeps the seq ranges the store holds, one
``series_segments`` row per run of consecutive seqs with the first row's t0 and the last row's t1.
From them alone a push is judged as store/series_rules.py judges it against stored rows:

- a row whose seq lies in a segment is held already (a resent batch): not new, nothing written;
- a new row must start no earlier than the row before it (by seq) ends and end no later than the
  row after it starts (within series_rules.TOLERANCE_S): the row before is the end of the segment
  or the push's row below it, the row after the start of the one above it;
- a row of a GPU the run does not hold is refused.

Segments touching after a push are merged, so a steady agent extends one row per stream per push.
Runs of seqs are only merged when consecutive: a gap may still be filled by a late row.
"""

from __future__ import annotations

import bisect
import functools
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store import schema, series_rules
from gpuledger.store.series_rules import Item, Refuse

HOST = ""  # the host stream's device_uuid
SEALED = "run.series_sealed"  # the seal of a series-only run's intervals, as the store holds them


class SeriesRequired(RuntimeError):
    """A push of a run whose rows only the series store holds reached a server without that store
    (``serve`` without --series-live / --series-only): nothing of it was stored; send it again."""


class Segment(NamedTuple):
    first_seq: int
    last_seq: int
    t0: float  # of the row at first_seq
    t1: float  # of the row at last_seq


def is_marked(conn: Connection, run_id: str) -> bool:
    """Whether ``run_id``'s raw intervals live in the series store only."""
    t = schema.series_only_runs
    return conn.scalar(sa.select(t.c.run_id).where(t.c.run_id == run_id)) is not None


def mark(conn: Connection, run_id: str, store: str) -> None:
    """List a run just created in the series-only mode (``store``: the store's URL as shown)."""
    conn.execute(sa.insert(schema.series_only_runs).values(run_id=run_id, store=store, marked_at=time.time()))


def seal(conn: Connection, run_id: str, summary: Mapping[str, Any], *, actor: str) -> bool:
    """Record ``summary`` (``LiveSeries.summary``: the store's rows of the run, per stream) as the
    seal of the run's intervals, unless the latest one says the same; whether it was recorded."""
    from gpuledger.store import audit  # audit imports the store's schema; kept out of import time

    if latest_seal(conn, run_id) == dict(summary):
        return False
    audit.append(conn, actor=actor, action=SEALED, obj=f"run:{run_id}", payload=dict(summary))
    return True


def latest_seal(conn: Connection, run_id: str) -> dict[str, Any] | None:
    """The latest ``run.series_sealed`` payload of the run (None: never sealed so)."""
    a = schema.audit_log.c
    q = sa.select(a.payload).where(a.object == f"run:{run_id}", a.action == SEALED).order_by(a.seq.desc()).limit(1)
    payload = conn.scalar(q)
    return None if payload is None else json.loads(payload)


def series_seals(conn: Connection) -> dict[str, dict[str, Any]]:
    """Per series-only run, its latest ``run.series_sealed`` payload."""
    a = schema.audit_log.c
    q = sa.select(a.object, a.payload).where(a.action == SEALED).order_by(a.seq)
    return {obj.removeprefix("run:"): json.loads(payload) for obj, payload in conn.execute(q)}


def segments(conn: Connection, run_id: str, streams: Iterable[str] | None = None) -> dict[str, list[Segment]]:
    """The run's segments per stream (GPU uuid, HOST), ordered by seq; ``streams``: only those."""
    c = schema.series_segments.c
    q = sa.select(c.device_uuid, c.first_seq, c.last_seq, c.t0, c.t1).where(c.run_id == run_id)
    if streams is not None:
        q = q.where(c.device_uuid.in_(sorted(set(streams))))
    out: dict[str, list[Segment]] = {}
    for r in conn.execute(q.order_by(c.device_uuid, c.first_seq)):
        out.setdefault(r.device_uuid, []).append(Segment(int(r.first_seq), int(r.last_seq), float(r.t0), float(r.t1)))
    return out


def streams(conn: Connection, run_id: str, uuids: Iterable[str]) -> dict[str, list[Segment]]:
    """``segments`` of those streams, each of them a key (a stream the store holds nothing of: [])."""
    wanted = sorted(set(uuids))
    found = segments(conn, run_id, wanted) if wanted else {}
    return {uuid: found.get(uuid, []) for uuid in wanted}


def last_t1(conn: Connection, run_id: str) -> float | None:
    """The end of the run's last interval the store holds, by the segments."""
    c = schema.series_segments.c
    value = conn.scalar(sa.select(sa.func.max(c.t1)).where(c.run_id == run_id))
    return None if value is None else float(value)


def keep_new(
    conn: Connection,
    run_id: str,
    series: str,
    items: Sequence[Item],
    columns: Sequence[str],
    devices: set[str] | None,
    refuse: Refuse,
    *,
    held: dict[str, list[Segment]] | None = None,
) -> list[Item]:
    """The ``items`` of ``series`` ("gpu" or "host") the store does not hold yet that keep each
    stream a timeline, in push order; a row held already (or twice in the push: the first wins) is
    left out silently, ``refuse(index, row, reason)`` for each other one left out. ``held``: the
    segments of streams read already in this transaction (``streams``), under the run's lock;
    those of its streams it lacks are read and added (``record`` then needs no read of its own)."""
    seq_at, t0_at, t1_at = (columns.index(c) for c in ("seq", "t0", "t1"))
    uuid_at = columns.index("device_uuid") if series == "gpu" else None
    groups: dict[str, list[Item]] = {}
    for i, r in items:
        uuid = HOST if uuid_at is None else str(r[uuid_at])
        if devices is not None and uuid not in devices:
            refuse(i, r, f"GPU {uuid} is not among the run's devices")
            continue
        groups.setdefault(uuid, []).append((i, r))
    read = held if held is not None else {}
    missing = [uuid for uuid in groups if uuid not in read]
    if missing:
        read |= streams(conn, run_id, missing)
    kept: list[Item] = []
    for uuid, group in groups.items():
        spans = list(read.get(uuid, []))  # disjoint, by first_seq; the push's kept rows join them
        firsts = [s.first_seq for s in spans]
        for i, r in sorted(group, key=lambda it: int(it[1][seq_at])):
            seq, t0, t1 = int(r[seq_at]), float(r[t0_at]), float(r[t1_at])
            at = bisect.bisect_right(firsts, seq)
            if at > 0 and spans[at - 1].last_seq >= seq:  # held, or this push's row of that seq
                continue
            why = _overlap(spans, at, seq, t0, t1)
            if why:
                refuse(i, r, why)
                continue
            spans.insert(at, Segment(seq, seq, t0, t1))
            firsts.insert(at, seq)
            kept.append((i, r))
    return sorted(kept, key=lambda it: it[0])


def _overlap(spans: list[Segment], at: int, seq: int, t0: float, t1: float) -> str | None:
    """The neighbours of a new row: spans[at - 1] ends below ``seq``, spans[at] starts above it."""
    tol = series_rules.TOLERANCE_S
    if at > 0:
        before = spans[at - 1]
        if t0 < before.t1 - tol:
            return (
                f"overlaps seq {before.last_seq} of the same series (ends {before.t1}): starts at {t0}, before it ends"
            )
    if at < len(spans):
        after = spans[at]
        if t1 > after.t0 + tol:
            return (
                f"overlaps seq {after.first_seq} of the same series (starts {after.t0}): ends at {t1}, after it starts"
            )
    return None


def merged(spans: Iterable[Segment]) -> list[Segment]:
    """Disjoint spans with runs of consecutive seqs joined, ordered by seq."""
    out: list[Segment] = []
    for s in sorted(spans):
        if out and out[-1].last_seq + 1 == s.first_seq:
            prev = out[-1]
            out[-1] = Segment(prev.first_seq, s.last_seq, prev.t0, s.t1)
        else:
            out.append(s)
    return out


def record(
    conn: Connection,
    run_id: str,
    series: str,
    rows: Sequence[Sequence[Any]],
    columns: Sequence[str],
    held: Mapping[str, list[Segment]] | None = None,
) -> int:
    """Add the new ``rows`` (kept by ``keep_new``) to the run's segments; the rows written.
    ``held``: as ``record_all``."""
    return record_all(conn, run_id, [(series, rows, columns)], held)


def record_all(
    conn: Connection,
    run_id: str,
    parts: Sequence[tuple[str, Sequence[Sequence[Any]], Sequence[str]]],
    held: Mapping[str, list[Segment]] | None = None,
) -> int:
    """``record`` of each (series, rows, columns) of a push, its GPUs' and its host's: the
    segments that grew updated by one executemany (a steady agent: one segment per stream and
    push), the new ones inserted by one more; the rows written. ``held``: the segments
    ``keep_new`` read in this transaction, under the run's lock (the streams of the rows among
    them); None, or a stream missing: read here."""
    new: dict[str, list[Segment]] = {}
    for series, rows, columns in parts:
        seq_at, t0_at, t1_at = (columns.index(c) for c in ("seq", "t0", "t1"))
        uuid_at = columns.index("device_uuid") if series == "gpu" else None
        for r in rows:
            uuid = HOST if uuid_at is None else str(r[uuid_at])
            seg = Segment(int(r[seq_at]), int(r[seq_at]), float(r[t0_at]), float(r[t1_at]))
            new.setdefault(uuid, []).append(seg)
    if not new:
        return 0
    old = held if held is not None and all(uuid in held for uuid in new) else segments(conn, run_id, new)
    t = schema.series_segments
    c = t.c
    inserts, updates, deleted = [], [], 0
    for uuid, spans in new.items():
        before = {s.first_seq: s for s in old.get(uuid, [])}
        after = {s.first_seq: s for s in merged([*before.values(), *spans])}
        gone = [q for q in before if q not in after]
        if gone:  # a gap filled: the segment above joins the one below (rare)
            conn.execute(sa.delete(t).where(c.run_id == run_id, c.device_uuid == uuid, c.first_seq.in_(gone)))
            deleted += len(gone)
        for q, s in after.items():
            if q not in before:
                inserts.append({"run_id": run_id, "device_uuid": uuid, **s._asdict()})
            elif before[q] != s:
                updates.append({"r": run_id, "u": uuid, "q": q, "new_last": s.last_seq, "new_t1": s.t1})
    if updates:
        conn.execute(_grow(), updates)
    if inserts:
        conn.execute(sa.insert(t), inserts)
    return deleted + len(updates) + len(inserts)


@functools.cache
def _grow() -> sa.Update:
    """``record``'s update of a segment that grew (bound r, u, q, new_last, new_t1), built once."""
    c = schema.series_segments.c
    key = (c.run_id == sa.bindparam("r"), c.device_uuid == sa.bindparam("u"), c.first_seq == sa.bindparam("q"))
    return (
        sa.update(schema.series_segments)
        .where(*key)
        .values(last_seq=sa.bindparam("new_last"), t1=sa.bindparam("new_t1"))
    )
