"""``POST /api/v1/capacity``: a node agent's capacity intervals and GPU sightings (docs/CAPACITY.md).

Capacity belongs to the fleet, not to a project, and comes from the node itself: only an agent
token bound to a host (docs/SERVER.md, "Ownership") may push it, for that host and for GPUs that
host owns (the first sighting registers a GPU to it; store/ownership.py), else 403. The batch's
shape is checked whole — every interval's four states must add up to its span (422) — then rows
that would count a GPU's time twice, before its first sighting or in a closed month are set aside
with the reason (store/capacity_guard.py) and the rest is stored in one transaction (store/capacity.py): intervals
already stored are skipped, so a batch sent twice changes nothing. With ``serve --series-live`` the new
intervals also go into the series store inside that transaction: a store that does not take them
rolls it back, answered 503 with Retry-After (store/series_live.py).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from gpuledger.core.capacity.model import CapacityInterval, Sighting, States
from gpuledger.server.auth import Principal, current_principal, require_writer
from gpuledger.server.wire_types import FUTURE_SKEW_S, MIN_T, Bytes, Short, T
from gpuledger.store import capacity_guard, closed_months, ownership, series_live
from gpuledger.store.capacity import write_capacity

router = APIRouter(prefix="/api/v1", tags=["capacity"])
Caller = Annotated[Principal, Depends(current_principal)]

Ms = Annotated[int, Field(ge=0, le=2**53)]
MAX_SPAN_MS = 86_400_000  # an agent's interval is seconds long; a day is absurd already


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class CapacityGpuIn(_Strict):
    uuid: Short
    name: Short
    host: Short
    first_seen: T
    last_seen: T
    instance_type: Short | None = None
    memory_total_b: Bytes | None = None
    pci_bus_id: Short | None = None
    mig_mode: Short | None = None


# gpu_uuid, host, t0_ms, t1_ms, unallocated_ms, alloc_idle_ms, busy_attr_ms, busy_unattr_ms,
# unmeasured_ms, energy_j (core/capacity/model.WIRE_COLUMNS)
Row = tuple[Short, Short, Ms, Ms, Ms, Ms, Ms, Ms, Ms, Annotated[float, Field(ge=0, allow_inf_nan=False)] | None]


class CapacityBatch(_Strict):
    intervals: Annotated[list[Row], Field(max_length=20_000)] = Field(default_factory=list)
    gpus: Annotated[list[CapacityGpuIn], Field(max_length=20_000)] = Field(default_factory=list)


class SetAside(BaseModel):
    series: str  # intervals | gpus
    index: int  # in the batch as sent
    item: str
    reason: str


class CapacityResult(BaseModel):
    received: int
    stored: int
    quarantined: list[SetAside] = Field(default_factory=list, description="rows set aside, with the reason")


ENROLL = "gpuledger admin token issue NODE --role agent --host NODE"


def _check_host(principal: Principal, batch: CapacityBatch) -> str:
    """The host the token speaks for; 403 unless every row and sighting is of that host."""
    if principal.role != "agent" or principal.host is None:
        raise HTTPException(
            status_code=403,
            detail=f"capacity comes from a node's own agent: push it with an agent token bound to the node ({ENROLL})",
        )
    for i, row in enumerate(batch.intervals):
        if row[1] != principal.host:
            raise HTTPException(status_code=403, detail=f"intervals[{i}]: host {row[1]!r} is not this token's host "
                                f"{principal.host!r}: each node pushes its own capacity")  # fmt: skip
    for i, g in enumerate(batch.gpus):
        if g.host != principal.host:
            raise HTTPException(status_code=403, detail=f"gpus[{i}]: host {g.host!r} is not this token's host "
                                f"{principal.host!r}: each node reports its own GPUs")  # fmt: skip
    return principal.host


def _intervals(batch: CapacityBatch, now: float) -> list[CapacityInterval]:
    out = []
    latest_ms = round((now + FUTURE_SKEW_S) * 1000)
    for i, (uuid, host, t0, t1, *rest) in enumerate(batch.intervals):
        iv = CapacityInterval(uuid, host, t0, t1, States(*rest[:4]), rest[4], rest[5])
        try:
            iv.check()
        except ValueError as exc:
            raise HTTPException(status_code=422, detail=f"intervals[{i}]: {exc}") from None
        if t0 < MIN_T * 1000 or t1 > latest_ms or t1 - t0 > MAX_SPAN_MS:
            raise HTTPException(status_code=422, detail=f"intervals[{i}]: times out of range ({t0}..{t1} ms)")
        out.append(iv)
    return out


@router.post("/capacity", summary="Push a node's capacity intervals and GPU sightings (idempotent)",
             response_model=CapacityResult)  # fmt: skip
async def push_capacity(request: Request, principal: Caller, batch: CapacityBatch) -> CapacityResult:
    require_writer(principal)
    host = _check_host(principal, batch)
    now = time.time()
    intervals = _intervals(batch, now)
    sightings = [Sighting(**g.model_dump()) for g in batch.gpus]
    for i, s in enumerate(sightings):
        if s.last_seen < s.first_seen:
            raise HTTPException(status_code=422, detail=f"gpus[{i}]: last_seen is before first_seen")
        if s.last_seen > now + FUTURE_SKEW_S:  # kept as the fleet's last sighting, it would price the future
            raise HTTPException(status_code=422, detail=f"gpus[{i}]: last_seen is in the future ({s.last_seen})")
    ledger = request.app.state.ledger

    writer = ownership.Writer.of(principal)
    live = getattr(request.app.state, "series_live", None)  # serve --series-live: into the store before commit
    closed_before = closed_months.boundary(now, request.app.state.settings.close_after_days)

    def write(conn: Any) -> tuple[int, list[capacity_guard.Refusal]]:
        uuids = {iv.gpu_uuid for iv in intervals} | {s.uuid for s in sightings}
        ownership.claim_gpus(conn, uuids, writer, host, context={"capacity": True}, what=f"capacity of host {host!r}")
        judged = capacity_guard.judge(conn, intervals, sightings, closed_before)
        stored = write_capacity(
            ledger.database, conn, judged.intervals, judged.sightings, actor=writer.actor,
            live=None if live is None else live.write_capacity,
        )  # fmt: skip
        capacity_guard.record(conn, judged.refused, batch.intervals, actor=writer.actor, host=host)
        return stored, judged.refused

    try:
        stored, refused = await run_in_threadpool(ledger.write, write)
    except ownership.PushRefused as exc:  # a GPU another enrolled host owns
        raise HTTPException(status_code=403, detail=str(exc)) from None
    except series_live.SeriesUnavailable as exc:  # nothing kept: the agent keeps its watermarks and sends again
        retry = {"Retry-After": str(series_live.RETRY_AFTER_S)}
        raise HTTPException(status_code=503, detail=f"{exc}; nothing was stored, retry later", headers=retry) from None
    aside = [SetAside(series=r.series, index=r.index, item=r.item, reason=r.reason) for r in refused]
    return CapacityResult(received=len(intervals), stored=stored, quarantined=aside)
