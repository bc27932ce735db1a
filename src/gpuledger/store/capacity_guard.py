"""What a capacity push may add, judged before anything is stored (docs/CAPACITY.md, "To the team server").

Every second of a GPU is in one state once: an interval that overlaps one already stored (or
another of the same batch) would count its time twice, and is set aside. A GPU is in the fleet
from its first sighting by its own (enrolled) host: capacity dated before it, and a sighting that
would move that first sighting back, would add time to the fleet that no agent saw (priced as
"unobserved"), and are set aside too. What is set aside is listed in the answer and written to the
audit trail (``capacity.quarantined``), with the reason; the rest of the batch is stored, so an
agent is never stuck behind one bad row.

Closed months (store/closed_months.py) hold for capacity as for runs: an interval dated before the
boundary is set aside, and so is a sighting seen only before it. A GPU new to the fleet whose first
sighting lies in a closed month enters the fleet at the boundary instead (listed in the answer with
the reason), so a closed month's capacity never gains a GPU, and the agent is not stuck.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.capacity.model import CapacityInterval, Sighting
from gpuledger.store import audit, closed_months
from gpuledger.store.schema import gpu_capacity, gpu_fleet

__all__ = ["QUARANTINED", "Judged", "Refusal", "judge", "record"]

QUARANTINED = "capacity.quarantined"
MAX_SPAN_MS = 86_400_000  # the longest interval the server takes (server/routes_capacity.py)
_LISTED = 200  # refused rows kept whole in one audit row; beyond, only their count


@dataclass(frozen=True)
class Refusal:
    series: str  # intervals | gpus
    index: int  # in the batch as sent
    item: str  # what the row said it was
    reason: str


@dataclass
class Judged:
    intervals: list[CapacityInterval] = field(default_factory=list)
    sightings: list[Sighting] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)


def _ms(t: float) -> int:
    return math.floor(t * 1000)


def judge(
    conn: Connection,
    intervals: Sequence[CapacityInterval],
    sightings: Sequence[Sighting],
    closed_before: float | None = None,
) -> Judged:
    """Split a batch into what may be stored and what is set aside (with the reason).

    ``closed_before``: the months before this instant are closed (None: none is)."""
    out = Judged()
    uuids = sorted({iv.gpu_uuid for iv in intervals} | {s.uuid for s in sightings})
    f = gpu_fleet.c
    first: dict[str, float] = {}
    for i in range(0, len(uuids), 500):
        first.update(conn.execute(sa.select(f.uuid, f.first_seen).where(f.uuid.in_(uuids[i : i + 500]))).all())
    said: dict[str, float] = {}
    for i, s in enumerate(sightings):
        known = first.get(s.uuid)
        if known is not None and _ms(s.first_seen) < _ms(known):
            reason = (f"first_seen {s.first_seen} is before the GPU's first sighting in the fleet ({known}): "
                      "the fleet's first sighting of a GPU never moves back")  # fmt: skip
            out.refused.append(Refusal("gpus", i, f"{s.uuid} on {s.host}", reason))
            continue
        if closed_before is not None and s.first_seen < closed_before:
            closed = f"bills before {closed_months.show(closed_before)} are final"
            if s.last_seen < closed_before:
                reason = f"last_seen {s.last_seen} is in a closed month ({closed}): the sighting adds nothing"
                out.refused.append(Refusal("gpus", i, f"{s.uuid} on {s.host}", reason))
                continue
            if known is None:  # new to the fleet: it enters where the open months start
                reason = (f"first_seen {s.first_seen} is in a closed month ({closed}): the GPU enters the "
                          f"fleet at {closed_before}")  # fmt: skip
                out.refused.append(Refusal("gpus", i, f"{s.uuid} on {s.host}", reason))
                s = dataclasses.replace(s, first_seen=closed_before)
        out.sightings.append(s)
        said[s.uuid] = min(said.get(s.uuid, s.first_seen), s.first_seen)
    by_gpu: dict[str, list[tuple[int, CapacityInterval]]] = {}
    for i, iv in enumerate(intervals):
        by_gpu.setdefault(iv.gpu_uuid, []).append((i, iv))
    for uuid, ivs in by_gpu.items():
        since = first.get(uuid, said.get(uuid))
        stored = _stored(conn, uuid, min(iv.t0_ms for _, iv in ivs), max(iv.t1_ms for _, iv in ivs))
        t0s = [s[0] for s in stored]
        last_end: int | None = None
        for i, iv in sorted(ivs, key=lambda p: (p[1].t0_ms, p[0])):
            item = f"{uuid} {iv.t0_ms}..{iv.t1_ms} ms"
            reason = _refusal(iv, since, stored, t0s, last_end, closed_before)
            if reason:
                out.refused.append(Refusal("intervals", i, item, reason))
                continue
            out.intervals.append(iv)
            last_end = iv.t1_ms if last_end is None else max(last_end, iv.t1_ms)
    out.refused.sort(key=lambda r: (r.series, r.index))
    return out


def _stored(conn: Connection, uuid: str, t0_ms: int, t1_ms: int) -> list[tuple[int, int]]:
    """The GPU's stored intervals that may overlap [t0_ms, t1_ms), by start (the key's index)."""
    c = gpu_capacity.c
    q = (
        sa.select(c.t0_ms, c.t1_ms)
        .where(c.gpu_uuid == uuid, c.t0_ms < t1_ms, c.t0_ms > t0_ms - MAX_SPAN_MS)
        .order_by(c.t0_ms)
    )
    return [(int(a), int(b)) for a, b in conn.execute(q)]


def _refusal(
    iv: CapacityInterval,
    since: float | None,
    stored: list[tuple[int, int]],
    t0s: list[int],
    last_end: int | None,
    closed_before: float | None = None,
) -> str | None:
    if closed_before is not None and iv.t0_ms < _ms(closed_before):
        return f"dated in a closed month (bills before {closed_months.show(closed_before)} are final)"
    if since is None:
        return "the GPU was never sighted: send its sighting (gpus) with its first capacity"
    if iv.t0_ms < _ms(since):
        return f"starts before the GPU's first sighting ({since}): the GPU was not in the fleet then"
    j = bisect.bisect_left(t0s, iv.t1_ms) - 1  # the last stored interval starting before this one ends
    if j >= 0 and stored[j] == (iv.t0_ms, iv.t1_ms):
        return None  # sent again: stored once (the key)
    for s0, s1 in stored[max(0, j - 1) : j + 1]:
        if s0 < iv.t1_ms and s1 > iv.t0_ms:
            return f"overlaps the stored interval {s0}..{s1} ms of the same GPU: its time would count twice"
    if last_end is not None and iv.t0_ms < last_end:
        return "overlaps an earlier interval of the same GPU in this batch: its time would count twice"
    return None


def record(conn: Connection, refused: Sequence[Refusal], rows: Sequence[Any], *, actor: str, host: str) -> None:
    """One audit row naming what a push had set aside, and why (the first rows whole)."""
    if not refused:
        return
    listed = [{"series": r.series, "index": r.index, "item": r.item, "reason": r.reason,
               "row": rows[r.index] if r.series == "intervals" and r.index < len(rows) else None}
              for r in refused[:_LISTED]]  # fmt: skip
    payload = {"host": host, "count": len(refused), "refused": listed}
    audit.append(conn, actor=actor, action=QUARANTINED, obj=f"host:{host}", payload=payload)
