"""The fleet inventory in the audit trail: what ``gpu_fleet`` and ``gpu_fleet_hosts`` say about a
GPU (its model name, host, instance type, memory, bus id, MIG mode, first sighting, and each host
it stayed on with that host's instance type) is what the capacity report prices it by, so every
change is an audit row and ``gpuledger audit verify`` replays them against the tables.

A capacity write that changes a GPU's record appends one ``fleet.changed`` row with the whole new
record of each GPU it changed. The last sighting moves with every push; it is recorded when it
reaches a new UTC day, so verify checks the day of each last sighting (an edit that stretches a
GPU's time in the fleet by a day or more is found) without an audit row per push. The first such
write of a ledger upgraded from before records every GPU it holds (its baseline).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store import rollup_audit
from gpuledger.store.schema import audit_log, gpu_fleet, gpu_fleet_hosts

__all__ = ["ACTIONS", "CHANGED", "FleetTrail", "audited_fold", "check", "records"]

CHANGED = "fleet.changed"
OBJECT = "fleet"
ACTIONS = frozenset({CHANGED})
FACTS = ("name", "host", "instance_type", "memory_total_b", "pci_bus_id", "mig_mode")
_DAY_S = 86_400
_CHUNK = 500

Record = dict[str, Any]


def _day(t: float) -> int:
    return int(t // _DAY_S)


def _rec(row: Mapping[str, Any], stays: list[Mapping[str, Any]]) -> Record:
    return {
        **{c: row[c] for c in FACTS},
        "first_seen": float(row["first_seen"]),
        "last_day": _day(float(row["last_seen"])),
        "stays": {s["host"]: {"first_seen": float(s["first_seen"]), "last_day": _day(float(s["last_seen"])),
                              "instance_type": s["instance_type"]} for s in stays},
    }  # fmt: skip


def records(conn: Connection, uuids: Iterable[str] | None = None) -> dict[str, Record]:
    """The fleet's record of each GPU (of ``uuids``; None: every GPU), as the trail keeps it."""
    f, h = gpu_fleet.c, gpu_fleet_hosts.c
    wanted = None if uuids is None else sorted(set(uuids))
    rows: list[Mapping[str, Any]] = []
    stays: dict[str, list[Mapping[str, Any]]] = {}
    chunks = [None] if wanted is None else [wanted[i : i + _CHUNK] for i in range(0, len(wanted), _CHUNK)]
    for chunk in chunks:
        q, qs = sa.select(gpu_fleet), sa.select(gpu_fleet_hosts)
        if chunk is not None:
            q, qs = q.where(f.uuid.in_(chunk)), qs.where(h.uuid.in_(chunk))
        rows += list(conn.execute(q).mappings())
        for s in conn.execute(qs).mappings():
            stays.setdefault(s["uuid"], []).append(s)
    return {r["uuid"]: _rec(r, stays.get(r["uuid"], [])) for r in rows}


def _has_baseline(conn: Connection) -> bool:
    q = sa.select(audit_log.c.seq).where(audit_log.c.object == OBJECT, audit_log.c.action == CHANGED).limit(1)
    return conn.execute(q).first() is not None


def audited_fold(conn: Connection, uuids: Iterable[str], fold: Callable[[], None], *, actor: str) -> None:
    """Run ``fold`` (sightings of ``uuids`` into the fleet tables) and, in a ledger with an audit
    trail, append one row with the new record of each GPU it changed."""
    if not rollup_audit.audited(conn):
        fold()  # a local ledger keeps no trail
        return
    from gpuledger.store import audit  # audit -> audit_verify -> audit_state imports this module

    uuids = sorted(set(uuids))
    before = records(conn, uuids)
    fold()
    baseline = not _has_baseline(conn)
    after = records(conn, None if baseline else uuids)
    changed = {u: r for u, r in after.items() if baseline or before.get(u) != r}
    if changed:
        payload = {"gpus": changed, **({"baseline": True} if baseline else {})}
        audit.append(conn, actor=actor, action=CHANGED, obj=OBJECT, payload=payload)


@dataclass
class FleetTrail:
    gpus: dict[str, tuple[Record, int]] = field(default_factory=dict)  # uuid -> (record, seq)

    def feed(self, seq: int, payload: Mapping[str, Any]) -> None:
        gpus = payload.get("gpus")
        if isinstance(gpus, dict):
            for uuid, rec in gpus.items():
                if isinstance(rec, dict):
                    self.gpus[str(uuid)] = (rec, seq)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and abs(float(a) - float(b)) < 1e-6
    return bool(a == b)


def _diff(now: Record, said: Record) -> list[str]:
    out = [f"{c} is {now.get(c)!r}, the audit trail says {said.get(c)!r}"
           for c in (*FACTS, "first_seen", "last_day") if not _same(now.get(c), said.get(c))]  # fmt: skip
    stays, said_stays = now.get("stays") or {}, said.get("stays") or {}
    for host in sorted(set(stays) | set(said_stays)):
        a, b = stays.get(host), said_stays.get(host)
        if a is None:
            out.append(f"its stay on {host!r} was deleted")
        elif b is None:
            out.append(f"a stay on {host!r} is not in the audit trail")
        else:
            out += [f"stay on {host!r}: {c} is {a.get(c)!r}, the audit trail says {b.get(c)!r}"
                    for c in ("first_seen", "last_day", "instance_type") if not _same(a.get(c), b.get(c))]  # fmt: skip
    return out


def check(conn: Connection, trail: FleetTrail) -> list[str]:
    """The fleet tables against the trail's records: each difference named."""
    if not trail.gpus:
        return []  # never recorded: a ledger upgraded from before, whose next capacity push records it
    out: list[str] = []
    now = records(conn)
    for uuid in sorted(set(now) | set(trail.gpus)):
        rec, said = now.get(uuid), trail.gpus.get(uuid)
        if said is None:
            out.append(f"gpu_fleet {uuid}: not in the audit trail (inserted outside gpuledger)")
        elif rec is None:
            out.append(f"gpu_fleet {uuid}: recorded at audit seq {said[1]}, deleted outside gpuledger")
        else:
            out += [f"gpu_fleet {uuid}: {d} (seq {said[1]})" for d in _diff(rec, said[0])]
    return out
