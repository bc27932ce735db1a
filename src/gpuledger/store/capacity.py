"""Writing the capacity ledger and the fleet inventory (migration 9; docs/CAPACITY.md).

``write_capacity`` stores an agent's intervals and sightings in one transaction: intervals whose
key (GPU, start) is new are inserted, and only those are added to the per GPU, day and host sums
(``gpu_capacity_days``), so a batch sent twice changes nothing — also after retention deleted its
intervals: nothing ending by retention's latest cut is stored (``retention_cut_ms``) — and the day
sums are always those of the stored intervals (``rebuild_days`` recomputes them from scratch; a
test checks the two agree).
The fleet rows take the earliest first sighting, the latest last one, and the host, name and
facts of the latest sighting: a GPU's history follows its UUID from host to host.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.capacity.model import (
    DAY_MS,
    CapacityDay,
    CapacityInterval,
    Sighting,
    States,
    merge_days,
    split_days,
)
from gpuledger.store import capacity_audit, capacity_fleet, partition_days
from gpuledger.store.engine import Database
from gpuledger.store.schema import audit_log, gpu_capacity, gpu_capacity_days, gpu_fleet, gpu_fleet_hosts
from gpuledger.store.schema_capacity import STATE_COLUMNS

__all__ = ["interval_from_row", "interval_row", "rebuild_days", "retention_cut_ms", "write_capacity"]

_CHUNK = 500
_CUT_LOOKBACK = 30  # the latest retention runs looked at for the capacity cut (some keep capacity)


def interval_row(iv: CapacityInterval) -> dict[str, Any]:
    return {
        "gpu_uuid": iv.gpu_uuid,
        "t0_ms": iv.t0_ms,
        "t1_ms": iv.t1_ms,
        "host": iv.host,
        **dict(zip(STATE_COLUMNS, iv.states.as_tuple(), strict=True)),
        "unmeasured_ms": iv.unmeasured_ms,
        "energy_j": iv.energy_j,
    }


def _day_row(d: CapacityDay) -> dict[str, Any]:
    return {
        "gpu_uuid": d.gpu_uuid,
        "day": d.day,
        "host": d.host,
        "first_ms": d.first_ms,
        "last_ms": d.last_ms,
        **dict(zip(STATE_COLUMNS, d.states.as_tuple(), strict=True)),
        "unmeasured_ms": d.unmeasured_ms,
        "energy_j": d.energy_j,
        "intervals": d.intervals,
    }


def _least(a: Any, b: Any) -> Any:
    return sa.case((a < b, a), else_=b)


def _greatest(a: Any, b: Any) -> Any:
    return sa.case((a > b, a), else_=b)


def _add_nullable(a: Any, b: Any) -> Any:
    """a + b where NULL means "not measured": NULL + x = x."""
    return sa.case((b.is_(None), a), (a.is_(None), b), else_=a + b)


def write_capacity(
    db: Database,
    conn: Connection,
    intervals: Sequence[CapacityInterval],
    sightings: Sequence[Sighting] = (),
    *,
    now: float | None = None,
    actor: str = "gpuledger capacity",
    live: Callable[[list[dict[str, Any]]], object] | None = None,
) -> int:
    """Store new intervals (each checked: its states add up to its span) and add them to the day
    sums; fold the sightings into the fleet; in a ledger with an audit trail, record what changed in
    the fleet (store/capacity_fleet.py, by ``actor``), seal the days due and reseal sealed days this
    changed (store/capacity_audit.py; ``now``: the wall clock by default). ``live``
    (``serve --series-live``): given the new intervals as ``gpu_capacity`` rows inside this
    transaction, so they are committed only when it returned (store/series_live.py). Returns how
    many intervals were new."""
    for iv in intervals:
        iv.check()
    cut = retention_cut_ms(conn)
    if cut is not None:  # retention deleted what ended by the cut, keeping the day sums: sent again, or
        # older than the retention window, such an interval would be counted a second time
        intervals = [iv for iv in intervals if iv.t1_ms > cut]
    inserted: list[CapacityInterval] = []
    by_key = {(iv.gpu_uuid, iv.t0_ms): iv for iv in intervals}
    keys = list(by_key)
    partition_days.require(db, conn, {gpu_capacity.name: [k[1] for k in keys]})  # their days' partitions first
    for i in range(0, len(keys), _CHUNK):
        rows = [interval_row(by_key[k]) for k in keys[i : i + _CHUNK]]
        ins = db.insert(gpu_capacity).on_conflict_do_nothing(index_elements=["gpu_uuid", "t0_ms"])
        # RETURNING names the rows that went in: only those are added to the day sums.
        result = conn.execute(ins.returning(gpu_capacity.c.gpu_uuid, gpu_capacity.c.t0_ms), rows)
        inserted += [by_key[(r[0], r[1])] for r in result]
    days = merge_days(part for iv in inserted for part in split_days(iv))
    if days:
        _add_days(db, conn, days)
    if sightings:
        fold = lambda: _fold_sightings(db, conn, sightings)  # noqa: E731
        capacity_fleet.audited_fold(conn, (s.uuid for s in sightings), fold, actor=actor)
    capacity_audit.after_write(conn, ((d.gpu_uuid, d.day, d.host) for d in days), len(inserted), now)
    if live is not None and inserted:
        live([interval_row(iv) for iv in inserted])
    return len(inserted)


def retention_cut_ms(conn: Connection) -> int | None:
    """The latest UTC midnight retention deleted the raw capacity intervals up to (its audit
    entries say; store/capacity_retention.py), or None when it never did."""
    log = audit_log.c
    # by the object's index: one entry per retention run, not a scan of the whole trail
    q = (
        sa.select(log.payload)
        .where(log.object == "retention", log.action == "retention.run")
        .order_by(log.seq.desc())
        .limit(_CUT_LOOKBACK)
    )
    cuts = []
    for payload in conn.scalars(q):
        try:
            cut = json.loads(payload).get("capacity", {}).get("cut_ms")
        except (ValueError, AttributeError):
            continue
        if isinstance(cut, int):
            cuts.append(cut)
    return max(cuts, default=None)


def _add_days(db: Database, conn: Connection, days: Sequence[CapacityDay]) -> None:
    ins = db.insert(gpu_capacity_days)
    t, new = gpu_capacity_days.c, ins.excluded
    update: dict[str, Any] = {name: t[name] + new[name] for name in (*STATE_COLUMNS, "unmeasured_ms", "intervals")}
    update.update(
        first_ms=_least(t.first_ms, new.first_ms),
        last_ms=_greatest(t.last_ms, new.last_ms),
        energy_j=_add_nullable(t.energy_j, new.energy_j),
    )
    stmt = ins.on_conflict_do_update(index_elements=["gpu_uuid", "day", "host"], set_=update)
    rows = [_day_row(d) for d in days]
    for i in range(0, len(rows), _CHUNK):
        conn.execute(stmt, rows[i : i + _CHUNK])


def _fold_sightings(db: Database, conn: Connection, sightings: Sequence[Sighting]) -> None:
    ins = db.insert(gpu_fleet)
    t, new = gpu_fleet.c, ins.excluded
    newer = new.last_seen >= t.last_seen
    latest = {c: sa.case((newer, new[c]), else_=t[c]) for c in ("name", "host", "pci_bus_id", "mig_mode")}
    for c in ("instance_type", "memory_total_b"):  # an agent that does not say keeps what another said
        latest[c] = sa.case((sa.and_(newer, new[c].is_not(None)), new[c]), else_=t[c])
    update = {
        **latest,
        "first_seen": _least(t.first_seen, new.first_seen),
        "last_seen": _greatest(t.last_seen, new.last_seen),
    }
    rows = [
        {
            "uuid": s.uuid, "name": s.name, "host": s.host, "first_seen": s.first_seen, "last_seen": s.last_seen,
            "instance_type": s.instance_type, "memory_total_b": s.memory_total_b, "pci_bus_id": s.pci_bus_id,
            "mig_mode": s.mig_mode,
        }
        for s in _latest_per_gpu(sightings)
    ]  # fmt: skip
    conn.execute(ins.on_conflict_do_update(index_elements=["uuid"], set_=update), rows)
    hins = db.insert(gpu_fleet_hosts)
    h, hnew = gpu_fleet_hosts.c, hins.excluded
    said = sa.and_(hnew.last_seen >= h.last_seen, hnew.instance_type.is_not(None))
    hupdate = {
        "first_seen": _least(h.first_seen, hnew.first_seen),
        "last_seen": _greatest(h.last_seen, hnew.last_seen),
        "instance_type": sa.case((said, hnew.instance_type), else_=h.instance_type),  # as on gpu_fleet
    }
    stays: dict[tuple[str, str], dict[str, Any]] = {}
    for s in sorted(sightings, key=lambda s: s.last_seen):
        stay = stays.setdefault((s.uuid, s.host), {"uuid": s.uuid, "host": s.host, "first_seen": s.first_seen,
                                                   "last_seen": s.last_seen, "instance_type": None})  # fmt: skip
        stay["first_seen"], stay["last_seen"] = (
            min(stay["first_seen"], s.first_seen),
            max(stay["last_seen"], s.last_seen),
        )
        stay["instance_type"] = s.instance_type or stay["instance_type"]
    conn.execute(hins.on_conflict_do_update(index_elements=["uuid", "host"], set_=hupdate), list(stays.values()))


def _latest_per_gpu(sightings: Sequence[Sighting]) -> list[Sighting]:
    """One sighting per GPU (an upsert takes each key once): the span of all, the facts of the latest
    (its instance type and memory: the latest that says, as the upsert keeps them across batches)."""
    out: dict[str, Sighting] = {}
    for s in sorted(sightings, key=lambda s: s.last_seen):
        prev = out.get(s.uuid)
        first, instance, memory = s.first_seen, s.instance_type, s.memory_total_b
        if prev is not None:
            first = min(prev.first_seen, first)
            instance = prev.instance_type if instance is None else instance
            memory = prev.memory_total_b if memory is None else memory
        out[s.uuid] = Sighting(s.uuid, s.name, s.host, first, s.last_seen, instance, memory, s.pci_bus_id,
                               s.mig_mode)  # fmt: skip
    return list(out.values())


def rebuild_days(db: Database, conn: Connection, from_day: int | None = None) -> int:
    """Recompute the day sums from the stored intervals (after a hand edit, or to check them): every
    day, or those from ``from_day`` on (after retention deleted the intervals of earlier days:
    store/capacity_retention.py, whose cut is a midnight, so no day from the cut on lost one)."""
    d = gpu_capacity_days.c
    conn.execute(sa.delete(gpu_capacity_days).where(sa.true() if from_day is None else d.day >= from_day))
    rows = sa.select(gpu_capacity)
    if from_day is not None:
        rows = rows.where(gpu_capacity.c.t1_ms > from_day * DAY_MS)
    parts: list[CapacityDay] = []
    for row in conn.execute(rows).mappings():
        parts += [p for p in split_days(interval_from_row(row)) if from_day is None or p.day >= from_day]
    days = merge_days(parts)
    if days:
        _add_days(db, conn, days)
    return len(days)


def interval_from_row(row: Any) -> CapacityInterval:
    return CapacityInterval(
        row["gpu_uuid"], row["host"], row["t0_ms"], row["t1_ms"], States(*(row[c] for c in STATE_COLUMNS)),
        row["unmeasured_ms"], row["energy_j"],
    )  # fmt: skip
