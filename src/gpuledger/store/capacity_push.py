"""An agent's capacity outbox in its LOCAL ledger: per server and GPU, the first interval start the
server has not acknowledged (``capacity_pushes``). Nothing is copied: what to push is the ledger's
own ``gpu_capacity`` rows from the watermarks on, and the server stores them idempotently, so a
crash between sending and saving the watermark only sends a batch twice.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.capacity.model import WIRE_COLUMNS
from gpuledger.store import audit
from gpuledger.store.schema import capacity_pushes, gpu_capacity, gpu_fleet, gpu_fleet_hosts

if TYPE_CHECKING:
    from gpuledger.store import Ledger

__all__ = ["REGISTERED", "Outbox", "acknowledge", "forget", "outbox", "pending", "register"]

# The gpu_uuid of a server's row that only says "this ledger pushes its capacity there" (no GPU
# has an empty UUID): retention then keeps every interval that server has not acknowledged, even
# before its first acknowledgement (store/capacity_retention.py).
REGISTERED = ""


def register(ledger: Ledger, server: str) -> None:
    """Record that this ledger pushes to ``server``, before anything is sent to it."""
    p = capacity_pushes.c
    known = sa.select(sa.func.count()).select_from(capacity_pushes).where(p.server == server)
    if ledger.read(lambda conn: conn.scalar(known)):
        return

    def tx(conn: Connection) -> None:
        ins = ledger.database.insert(capacity_pushes).on_conflict_do_nothing()
        conn.execute(ins, [{"server": server, "gpu_uuid": REGISTERED, "next_t0_ms": 0, "updated_at": time.time()}])

    ledger.write(tx)


def pending(ledger: Ledger, server: str, budget: int) -> tuple[list[list[Any]], list[dict[str, Any]]]:
    """(at most ``budget`` intervals not acknowledged by ``server``, oldest first per GPU, as wire
    rows; the fleet's record of their GPUs, one entry per GPU and host, with the instance type that
    host's agent named)."""
    c, p = gpu_capacity.c, capacity_pushes.c
    mark = sa.select(p.next_t0_ms).where(p.server == server, p.gpu_uuid == c.gpu_uuid).scalar_subquery()
    q = (
        sa.select(*(c[name] for name in WIRE_COLUMNS))
        .where(c.t0_ms >= sa.func.coalesce(mark, 0))
        .order_by(c.gpu_uuid, c.t0_ms)
        .limit(budget)
    )

    def tx(conn: Connection) -> tuple[list[list[Any]], list[dict[str, Any]]]:
        rows = [list(r) for r in conn.execute(q)]
        uuids = sorted({r[0] for r in rows})
        gpus: list[dict[str, Any]] = []
        if uuids:
            f, h = gpu_fleet.c, gpu_fleet_hosts.c
            facts = {r["uuid"]: r for r in conn.execute(sa.select(gpu_fleet).where(f.uuid.in_(uuids))).mappings()}
            for stay in conn.execute(sa.select(gpu_fleet_hosts).where(h.uuid.in_(uuids))).mappings():
                gpu = facts.get(stay["uuid"])
                if gpu is None:
                    continue
                gpus.append({
                    "uuid": stay["uuid"], "name": gpu["name"], "host": stay["host"],
                    "first_seen": stay["first_seen"], "last_seen": stay["last_seen"],
                    "instance_type": stay["instance_type"], "memory_total_b": gpu["memory_total_b"],
                    "pci_bus_id": gpu["pci_bus_id"], "mig_mode": gpu["mig_mode"],
                })  # fmt: skip
        return rows, gpus

    return ledger.read(tx)


def acknowledge(ledger: Ledger, server: str, marks: Mapping[str, int]) -> None:
    """The server stored every interval of these GPUs that starts before ``marks[gpu]``."""
    if not marks:
        return
    now = time.time()

    def tx(conn: Connection) -> None:
        db = ledger.database
        ins = db.insert(capacity_pushes)
        stmt = ins.on_conflict_do_update(
            index_elements=["server", "gpu_uuid"],
            set_={"next_t0_ms": ins.excluded.next_t0_ms, "updated_at": ins.excluded.updated_at},
        )
        conn.execute(stmt, [{"server": server, "gpu_uuid": u, "next_t0_ms": m, "updated_at": now}
                            for u, m in sorted(marks.items())])  # fmt: skip

    ledger.write(tx)


@dataclass(frozen=True)
class Outbox:
    """What one server this ledger pushes capacity to still lacks."""

    server: str
    gpus_acknowledged: int  # GPUs the server has a watermark for
    unacknowledged: int  # intervals it has not acknowledged (retention keeps them for it)
    oldest_t0_ms: int | None  # the start of the oldest of them
    last_acknowledged_at: float | None  # when the server last acknowledged anything (None: never)


def outbox(ledger: Ledger, server: str | None = None) -> list[Outbox]:
    """The capacity outbox of every server this ledger pushes to (or of ``server``), by server."""
    c, p = gpu_capacity.c, capacity_pushes.c
    servers = sa.select(p.server).distinct().order_by(p.server)
    if server is not None:
        servers = servers.where(p.server == server)

    def tx(conn: Connection) -> list[Outbox]:
        out = []
        for name in conn.scalars(servers).all():
            mark = sa.and_(p.server == name, p.gpu_uuid == c.gpu_uuid)
            lacking = (
                sa.select(sa.func.count(), sa.func.min(c.t0_ms))
                .select_from(gpu_capacity.outerjoin(capacity_pushes, mark))
                .where(c.t0_ms >= sa.func.coalesce(p.next_t0_ms, 0))
            )
            count, oldest = conn.execute(lacking).one()
            acked = sa.select(sa.func.count(), sa.func.max(p.updated_at)).where(
                p.server == name, p.gpu_uuid != REGISTERED
            )
            gpus, last = conn.execute(acked).one()
            out.append(Outbox(name, int(gpus or 0), int(count or 0), oldest, last))
        return out

    return ledger.read(tx)


def forget(ledger: Ledger, server: str, *, actor: str) -> Outbox:
    """Stop keeping capacity for ``server`` (no longer pushed to): its watermarks go, so retention
    no longer keeps intervals only it lacked. Audited; returns what it still lacked. LookupError
    when this ledger does not push to ``server``."""
    found = outbox(ledger, server)
    if not found:
        raise LookupError(f"this ledger does not push capacity to {server}")
    box = found[0]

    def tx(conn: Connection) -> None:
        conn.execute(sa.delete(capacity_pushes).where(capacity_pushes.c.server == server))
        payload = {"server": server, "unacknowledged": box.unacknowledged, "oldest_t0_ms": box.oldest_t0_ms}
        audit.append(conn, actor=actor, action="capacity.forget_server", obj=server, payload=payload)

    ledger.write(tx)
    return box
