"""Who may push a run, and which host a GPU belongs to (``run_owners``, ``gpu_owners``), audited.

A run belongs to the user of the token that created it (an agent identity, usually the machine's
name) and to the host its record names; only that user's tokens may push it again, so another
agent of the same project cannot rewrite it.

A GPU (or the GPU a MIG slice lives on) belongs to a host. An *enrolled* host is one an admin
issued an agent token bound to (``gpuledger admin token issue NODE --role agent --host NODE``):
such a token speaks only for its host (a run naming another host is refused, 403), and only it
(or an admin) registers a GPU for good (source ``enrolled``). A GPU first named by an unbound token
(tokens issued before hosts existed) is registered provisionally (source ``push``): the enrolled
host that reports it later takes it over, audited, so nobody can squat another machine's GPUs
ahead of it. A GPU an enrolled host registered is refused to every other host until an admin
re-homes it. Every change here is an audit row in the same transaction, so ``gpuledger audit
verify`` can check both tables against the trail.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store import schema
from gpuledger.store.errors import LedgerError, RunNotFound

if TYPE_CHECKING:
    from gpuledger.core.audit.access import Principal
    from gpuledger.store.ledger import Ledger


class PushRefused(LedgerError):
    """A push that would rewrite history or take what belongs to someone else (HTTP 409)."""


class HostRefused(PushRefused):
    """A token speaking for a host it is not enrolled for (HTTP 403)."""


class TeamLedgerRefused(LedgerError):
    """A run written straight into a team server's database, around the server."""


def refuse_direct_recording(conn: Connection, display: str) -> None:
    """Refuse to record a run straight into a team ledger (one with API tokens): there it would be
    neither owned nor audited nor signed, and ``verify`` would rightly call it forged."""
    if conn.execute(sa.select(schema.api_tokens.c.id).limit(1)).first() is not None:
        raise TeamLedgerRefused(
            f"{display} is a team server's ledger: runs go into it through the server, which records who owns them "
            "and signs their history. Record with `gpuledger run --server URL` (docs/SERVER.md); without --db, "
            "gpuledger run records into your local ledger"
        )


@dataclass(frozen=True)
class Writer:
    """The principal pushing: its user (the agent identity), token, the host the token is bound
    to (None: not enrolled) and whether it is an admin's."""

    user: str
    token_id: str = ""
    host: str | None = None
    admin: bool = False

    @classmethod
    def of(cls, principal: Principal) -> Writer:
        return cls(principal.user, principal.token_id, principal.host, principal.role == "admin")

    @property
    def actor(self) -> str:
        return f"{self.user} (token {self.token_id})" if self.token_id else self.user

    def check_host(self, host: str) -> None:
        """A host-bound token speaks for its own host only."""
        if self.host is not None and host != self.host:
            raise HostRefused(
                f"token {self.token_id} is bound to host {self.host!r}: it may not push for host {host!r} "
                "(each machine reports with its own token: gpuledger admin token issue USER --role agent --host HOST)"
            )


ENROLLED, PROVISIONAL = "enrolled", "push"  # gpu_owners.source: by an enrolled host (or an admin), or not


# -- runs -----------------------------------------------------------------------------------------


def owner_of(conn: Connection, run_id: str) -> dict[str, Any] | None:
    o = schema.run_owners.c
    row = conn.execute(sa.select(schema.run_owners).where(o.run_id == run_id)).mappings().first()
    return None if row is None else dict(row)


def _set_owner(conn: Connection, run_id: str, user: str, token_id: str | None, host: str) -> None:
    o = schema.run_owners.c
    conn.execute(sa.delete(schema.run_owners).where(o.run_id == run_id))
    conn.execute(
        sa.insert(schema.run_owners).values(
            run_id=run_id, user_name=user, token_id=token_id, host=host, since=time.time()
        )
    )


def record_creator(conn: Connection, run_id: str, writer: Writer, host: str) -> None:
    """The creating push: the run is its writer's (the run.created audit row names the owner)."""
    writer.check_host(host)
    _set_owner(conn, run_id, writer.user, writer.token_id or None, host)


def check_pusher(conn: Connection, run_id: str, writer: Writer, host: str) -> None:
    """Refuse a push of ``run_id`` by anyone but its owner. A run stored before runs had owners
    (migration 7) is claimed by its first pusher, audited. A host-bound token pushes runs of its
    host only (HostRefused)."""
    from gpuledger.store import audit  # with cryptography: not loaded for a local run

    writer.check_host(host)
    owner = owner_of(conn, run_id)
    if owner is None:
        _set_owner(conn, run_id, writer.user, writer.token_id or None, host)
        payload = {"owner": writer.user, "token": writer.token_id or None, "host": host}
        audit.append(conn, actor=writer.actor, action="run.owner_claimed", obj=f"run:{run_id}", payload=payload)
        return
    if owner["user_name"] != writer.user:
        raise PushRefused(
            f"run {run_id} belongs to {owner['user_name']!r} (host {owner['host']!r}): only that agent's tokens may "
            f"push it; an admin can transfer it: gpuledger admin run transfer {run_id} --to {writer.user}"
        )


def transfer(ledger: Ledger, run_id: str, to_user: str, *, actor: str, note: str | None = None) -> str:
    """Give ``run_id`` to ``to_user`` (an admin's decision, audited); returns the previous owner."""
    from gpuledger.store import audit  # with cryptography: not loaded for a local run

    def tx(conn: Connection) -> str:
        r = schema.runs.c
        host = conn.scalar(sa.select(r.host).where(r.id == run_id))
        if host is None:
            raise RunNotFound(run_id)
        if conn.scalar(sa.select(schema.users.c.name).where(schema.users.c.name == to_user)) is None:
            raise LedgerError(f"no user {to_user!r}; add it with: gpuledger admin user add {to_user}")
        before = owner_of(conn, run_id)
        previous = before["user_name"] if before else ""
        _set_owner(conn, run_id, to_user, None, str(host))
        payload = {"from": previous or None, "to": to_user, "host": host, "note": note}
        audit.append(conn, actor=actor, action="run.transferred", obj=f"run:{run_id}", payload=payload)
        return previous

    return ledger.write(tx)


# -- GPUs -----------------------------------------------------------------------------------------


def gpu_uuids(devices: Iterable[Mapping[str, Any]]) -> list[str]:
    """The GPU UUIDs a run's devices name: each device's, and the parent GPU of a MIG slice."""
    out: set[str] = set()
    for d in devices:
        out.add(str(d["uuid"]))
        if d.get("mig_parent_uuid"):
            out.add(str(d["mig_parent_uuid"]))
    return sorted(out)


def _insert_new(conn: Connection, table: sa.Table, row: dict[str, Any]) -> bool:
    """INSERT ... ON CONFLICT DO NOTHING; whether the row went in (another push may have just
    registered the same key)."""
    from sqlalchemy.dialects import postgresql, sqlite

    ins = (sqlite.insert if conn.dialect.name == "sqlite" else postgresql.insert)(table).values(row)
    pk = [c.name for c in table.primary_key.columns]
    return (
        conn.execute(ins.on_conflict_do_nothing(index_elements=pk).returning(*table.primary_key.columns)).first()
        is not None
    )


def check_gpus(conn: Connection, run_id: str, uuids: Iterable[str], writer: Writer, host: str) -> None:
    """Register the GPUs no one has reported yet to ``host`` and ``writer``; refuse a GPU that
    belongs to another host or agent (PushRefused)."""
    claim_gpus(conn, uuids, writer, host, context={"run": run_id}, what=f"run {run_id} of host {host!r}")


def claim_gpus(
    conn: Connection, uuids: Iterable[str], writer: Writer, host: str, *, context: Mapping[str, Any], what: str
) -> None:
    """The ownership rules of the module docstring, for GPUs a push of ``host`` names: register the
    new ones, let an enrolled host take over its provisional ones, refuse the rest (PushRefused)."""
    from gpuledger.store import audit  # with cryptography: not loaded for a local run

    wanted = sorted(set(uuids))
    if not wanted:
        return
    g = schema.gpu_owners.c
    enrolled = writer.admin or writer.host == host
    source = ENROLLED if enrolled else PROVISIONAL
    known = {r.uuid: r for r in conn.execute(sa.select(schema.gpu_owners).where(g.uuid.in_(wanted)))}
    payload = {"host": host, "user": writer.user, **context, "source": source}
    for uuid in wanted:
        owner = known.get(uuid)
        if owner is None:
            row = {"uuid": uuid, "host": host, "user_name": writer.user, "since": time.time(), "source": source}
            if _insert_new(conn, schema.gpu_owners, row):
                audit.append(conn, actor=writer.actor, action="gpu.registered", obj=f"gpu:{uuid}", payload=payload)
                continue
            owner = conn.execute(sa.select(schema.gpu_owners).where(g.uuid == uuid)).first()
        firm = owner.source in (ENROLLED, "admin")  # an enrolled host's or an admin's word
        if enrolled and firm and owner.host == host:
            continue  # any token of the enrolled host
        if enrolled and not firm:
            # registered before its host was enrolled (by an unbound token, or migration 7's guess):
            # the enrolled host's word is better
            conn.execute(
                sa.update(schema.gpu_owners).where(g.uuid == uuid)
                .values(host=host, user_name=writer.user, source=ENROLLED, since=time.time())
            )  # fmt: skip
            claimed = payload | {"from_host": owner.host, "from_user": owner.user_name}
            audit.append(conn, actor=writer.actor, action="gpu.claimed", obj=f"gpu:{uuid}", payload=claimed)
            continue
        if not enrolled and owner.host == host and owner.user_name == writer.user:
            continue  # an unbound token: the agent that registered it
        if not enrolled and owner.host == host and owner.user_name is None:  # any agent of the host may claim
            conn.execute(sa.update(schema.gpu_owners).where(g.uuid == uuid).values(user_name=writer.user))
            audit.append(conn, actor=writer.actor, action="gpu.claimed", obj=f"gpu:{uuid}", payload=payload)
            continue
        raise PushRefused(
            f"GPU {uuid} belongs to host {owner.host!r} (agent {owner.user_name or 'any'}); {what} "
            f"(agent {writer.user!r}) may not report it. If the GPU really moved, an admin re-homes it: "
            f"gpuledger admin gpu rehome {uuid} --host {host} --agent {writer.user}"
        )


def rehome(ledger: Ledger, uuid: str, host: str, user: str | None, *, actor: str) -> dict[str, Any] | None:
    """Give GPU ``uuid`` to ``host`` (and agent ``user``; None: any agent of the host), audited;
    returns the previous owner row, if any."""
    from gpuledger.store import audit  # with cryptography: not loaded for a local run

    def tx(conn: Connection) -> dict[str, Any] | None:
        g = schema.gpu_owners.c
        before = conn.execute(sa.select(schema.gpu_owners).where(g.uuid == uuid)).mappings().first()
        conn.execute(sa.delete(schema.gpu_owners).where(g.uuid == uuid))
        conn.execute(
            sa.insert(schema.gpu_owners).values(uuid=uuid, host=host, user_name=user, since=time.time(), source="admin")
        )
        payload = {"host": host, "user": user, "from_host": before["host"] if before else None,
                   "from_user": before["user_name"] if before else None}  # fmt: skip
        audit.append(conn, actor=actor, action="gpu.rehomed", obj=f"gpu:{uuid}", payload=payload)
        return None if before is None else dict(before)

    return ledger.write(tx)


def list_gpus(ledger: Ledger) -> list[dict[str, Any]]:
    g = schema.gpu_owners.c
    return ledger.read(lambda c: [dict(r) for r in c.execute(sa.select(schema.gpu_owners).order_by(g.host, g.uuid))
                                  .mappings()])  # fmt: skip
