"""Read queries of the capacity ledger and the fleet (SQLAlchemy Core, SQLite and PostgreSQL).

The capacity report reads ``gpu_capacity_days`` (one row per GPU, day and host: a month of a
1,024-GPU fleet is ~32,000 rows) and the fleet; GPUs no agent has seen are found from the runs
recorded on them (``unmetered_devices``), for wrapped-only deployments. Read-only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.capacity.model import CapacityDay, FleetGpu, HostStay, States
from gpuledger.store.cost_queries import _fetch
from gpuledger.store.queries import open_run
from gpuledger.store.schema import devices, gpu_capacity, gpu_capacity_days, gpu_fleet, gpu_fleet_hosts, runs
from gpuledger.store.schema_capacity import STATE_COLUMNS

__all__ = [
    "DAY_COLUMNS",
    "RunHold",
    "day_rows",
    "days_of",
    "fleet",
    "held_by_open_runs",
    "intervals",
    "run_hosts",
    "run_spans",
    "unmetered_devices",
]

# The tuple day_rows returns, in order.
DAY_COLUMNS = ("gpu_uuid", "day", "host", "first_ms", "last_ms", *STATE_COLUMNS, "unmeasured_ms", "energy_j")


def fleet(conn: Connection, uuids: Iterable[str] | None = None) -> list[FleetGpu]:
    """The GPUs agents have seen (or those of ``uuids``), each with every host it was seen on."""
    f, h = gpu_fleet.c, gpu_fleet_hosts.c
    q = sa.select(gpu_fleet).order_by(f.host, f.uuid)
    hq = sa.select(gpu_fleet_hosts).order_by(h.uuid, h.first_seen, h.host)
    if uuids is not None:
        wanted = sorted(set(uuids))
        q, hq = q.where(f.uuid.in_(wanted)), hq.where(h.uuid.in_(wanted))
    stays: dict[str, list[HostStay]] = {}
    for r in conn.execute(hq):
        stays.setdefault(r.uuid, []).append(HostStay(r.host, r.first_seen, r.last_seen, r.instance_type))
    out = []
    for r in conn.execute(q).mappings():
        extra = {k: r[k] for k in ("pci_bus_id", "mig_mode") if r[k] is not None}
        out.append(
            FleetGpu(
                r["uuid"],
                r["name"],
                r["host"],
                r["first_seen"],
                r["last_seen"],
                tuple(stays.get(r["uuid"], ())),
                r["instance_type"],
                r["memory_total_b"],
                "agent",
                extra,
            )
        )
    return out


def day_rows(conn: Connection, first_day: int, last_day: int) -> list[tuple[Any, ...]]:
    """``gpu_capacity_days`` rows from ``first_day`` to ``last_day`` as plain tuples (DAY_COLUMNS)."""
    d = gpu_capacity_days.c
    q = sa.select(*(d[c] for c in DAY_COLUMNS)).where(d.day >= first_day, d.day <= last_day)
    return _fetch(conn, q)


def days_of(rows: Iterable[Sequence[Any]]) -> list[CapacityDay]:
    """day_rows tuples as CapacityDay records (for callers that want the dataclass)."""
    return [CapacityDay(r[0], r[1], r[2], r[3], r[4], States(*r[5:9]), r[9], r[10], 0, "agent") for r in rows]


def intervals(conn: Connection, gpu_uuid: str | None = None, host: str | None = None) -> list[dict[str, Any]]:
    """Stored capacity intervals, oldest first (one GPU's, one host's, or all)."""
    c = gpu_capacity.c
    q = sa.select(gpu_capacity).order_by(c.gpu_uuid, c.t0_ms)
    if gpu_uuid is not None:
        q = q.where(c.gpu_uuid == gpu_uuid)
    if host is not None:
        q = q.where(c.host == host)
    return [dict(r) for r in conn.execute(q).mappings()]


@dataclass(frozen=True, slots=True)
class RunHold:
    """The GPUs (MIG slices: their parents) an open run of this host holds, and its recorder."""

    run_id: str
    recorder_pid: int | None
    started_at: float
    gpus: frozenset[str]


def held_by_open_runs(conn: Connection, host: str) -> list[RunHold]:
    """The open runs of ``host`` with the GPUs they hold: what the node agent counts as held by a
    wrapped run, whether or not a process of it is on the GPU at the moment, while its recorder lives."""
    d, r = devices.c, runs.c
    q = (
        sa.select(r.id, r.recorder_pid, r.started_at, d.uuid, d.mig_parent_uuid)
        .join(runs, r.id == d.run_id)
        .where(r.host == host, open_run(r))
        .order_by(r.id)
    )
    found: dict[str, tuple[int | None, float, set[str]]] = {}
    for run_id, pid, started, uuid, parent in conn.execute(q):
        found.setdefault(run_id, (pid, started, set()))[2].add(parent or uuid)
    return [RunHold(k, pid, started, frozenset(gpus)) for k, (pid, started, gpus) in found.items()]


# Every distinct device uuid by walking the uuid index (a loose index scan: one probe per GPU, not
# one row per run and GPU), on SQLite and PostgreSQL alike.
_DEVICE_UUIDS = sa.text(
    "WITH RECURSIVE walk(u) AS (SELECT min(uuid) FROM devices "
    "UNION ALL SELECT (SELECT min(uuid) FROM devices WHERE uuid > walk.u) FROM walk WHERE walk.u IS NOT NULL) "
    "SELECT u FROM walk WHERE u IS NOT NULL"
)


def unmetered_devices(
    conn: Connection, start: float, end: float, *, before: bool = False, replayed: bool = False
) -> list[tuple[str, str, str, str, float]]:
    """(run id, physical GPU uuid, device name, run host, run start) of the runs that may have used a
    GPU in [start, end) on a GPU no agent has seen (the GPU, or a MIG slice's parent, is not in
    gpu_fleet); with ``before``, of the latest run on each such GPU that started before ``end``
    instead (where a GPU was between its runs: one row per GPU). Cheap when every GPU runs used is
    in the fleet: the device uuids come from their index, and only the unknown ones are joined to
    their runs. Runs of a replayed GPU trace (--replay-gpus, no real GPU) only with ``replayed``."""
    fleet_uuids = set(conn.scalars(sa.select(gpu_fleet.c.uuid)))
    unknown = sorted(set(conn.scalars(_DEVICE_UUIDS)) - fleet_uuids)
    if not unknown:
        return []
    d = devices.c
    physical = sa.func.coalesce(d.mig_parent_uuid, d.uuid)
    out: list[tuple[str, str, str, str, float]] = []
    for i in range(0, len(unknown), 2000):
        q = (
            sa.select(d.run_id, physical, d.name, runs.c.host, runs.c.started_at)
            .select_from(runs.join(devices, d.run_id == runs.c.id))
            .where(d.uuid.in_(unknown[i : i + 2000]), runs.c.started_at < end)
        )
        if not replayed:  # before the ranking: a demo run is never a GPU's latest run
            q = q.where(runs.c.replayed == sa.false())
        if before:
            order = (runs.c.started_at.desc(), d.run_id.desc())
            rank = sa.func.row_number().over(partition_by=physical, order_by=order).label("rank")
            ranked = q.add_columns(rank).subquery()
            q = sa.select(*list(ranked.c)[:5]).where(ranked.c.rank == 1)
        else:
            q = q.where(sa.or_(runs.c.ended_at.is_(None), runs.c.ended_at > start))
        out += [(r[0], r[1], r[2], r[3], r[4]) for r in conn.execute(q) if r[1] not in fleet_uuids]
    return out


def run_spans(
    conn: Connection, uuids: Iterable[str], *, replayed: bool = False
) -> dict[str, tuple[float, float | None]]:
    """Per physical GPU of ``uuids``: the first start and the last end of every run recorded on it
    (or on one of its MIG slices), whenever; the end is None while one of them is still open.
    Replayed runs (--replay-gpus) count only with ``replayed``."""
    d = devices.c
    physical = sa.func.coalesce(d.mig_parent_uuid, d.uuid)
    open_now = sa.func.max(sa.case((open_run(runs.c), 1), else_=0))
    out: dict[str, tuple[float, float | None]] = {}
    wanted = sorted(set(uuids))
    for i in range(0, len(wanted), 2000):
        q = (
            sa.select(physical, sa.func.min(runs.c.started_at), sa.func.max(runs.c.ended_at), open_now)
            .select_from(runs.join(devices, d.run_id == runs.c.id))
            .where(physical.in_(wanted[i : i + 2000]), sa.true() if replayed else runs.c.replayed == sa.false())
            .group_by(physical)
        )
        for uuid, first, last, still_open in conn.execute(q):
            out[uuid] = (first, None if still_open else (last if last is not None else first))
    return out


def run_hosts(conn: Connection, run_ids: Sequence[str]) -> dict[str, str]:
    """run id -> the host it was recorded on."""
    out: dict[str, str] = {}
    for i in range(0, len(run_ids), 2000):
        q = sa.select(runs.c.id, runs.c.host).where(runs.c.id.in_(list(run_ids[i : i + 2000])))
        out.update({r[0]: r[1] for r in conn.execute(q)})
    return out
