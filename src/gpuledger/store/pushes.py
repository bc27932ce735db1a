"""The agent's outbox in the local ledger: per server and run, what the server acknowledged.

Nothing is copied: the rows to push are the local ledger's own rows beyond the watermarks
(``gpu_next`` per device, ``host_next``, ``event_next``, ``metric_next``: the next seq to push),
so the outbox survives any crash of gpuledger and costs no extra writes while recording.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store import schema

if TYPE_CHECKING:
    from gpuledger.store.ledger import Ledger

REJECTED = "rejected: "  # last_error prefix of a run the server refused (not retried by itself)


@dataclass
class PushState:
    server: str
    run_id: str
    gpu_next: dict[str, int] = field(default_factory=dict)
    host_next: int = 0
    event_next: int = 0
    metric_next: int = 0
    run_sig: str | None = None
    log_sig: str | None = None
    done: bool = False
    last_error: str | None = None


def register(ledger: Ledger, server: str, run_ids: Iterable[str]) -> int:
    """Start pushing these runs to ``server`` (runs already registered are left as they are)."""
    p = schema.push_state.c

    def tx(conn: Connection) -> int:
        known = set(conn.scalars(sa.select(p.run_id).where(p.server == server)))
        new = [r for r in dict.fromkeys(run_ids) if r not in known]
        if new:
            now = time.time()
            conn.execute(
                sa.insert(schema.push_state),
                [{"server": server, "run_id": r, "gpu_next": {}, "updated_at": now, "done": False} for r in new],
            )
        return len(new)

    return ledger.write(tx)


def _state(row: Any) -> PushState:
    return PushState(
        row.server, row.run_id, dict(row.gpu_next or {}), row.host_next, row.event_next, row.metric_next,
        row.run_sig, row.log_sig, bool(row.done), row.last_error,
    )  # fmt: skip


def get(ledger: Ledger, server: str, run_id: str) -> PushState | None:
    p = schema.push_state.c
    q = sa.select(schema.push_state).where(p.server == server, p.run_id == run_id)
    row = ledger.read(lambda c: c.execute(q).first())
    return None if row is None else _state(row)


def pending(ledger: Ledger, server: str, *, include_rejected: bool = False) -> list[PushState]:
    """Runs not fully pushed to ``server``, oldest run first."""
    p = schema.push_state.c
    q = sa.select(schema.push_state).where(p.server == server, p.done.is_(False)).order_by(p.run_id)
    states = [_state(r) for r in ledger.read(lambda c: list(c.execute(q)))]
    if include_rejected:
        return states
    return [s for s in states if not (s.last_error or "").startswith(REJECTED)]


def all_states(ledger: Ledger, server: str | None = None) -> list[PushState]:
    q = sa.select(schema.push_state).order_by(schema.push_state.c.run_id)
    if server is not None:
        q = q.where(schema.push_state.c.server == server)
    return [_state(r) for r in ledger.read(lambda c: list(c.execute(q)))]


def unregistered_runs(ledger: Ledger, server: str) -> list[str]:
    """Local runs never registered for ``server`` (``gpuledger sync --all``)."""
    p, r = schema.push_state.c, schema.runs.c
    q = sa.select(r.id).where(r.id.not_in(sa.select(p.run_id).where(p.server == server))).order_by(r.id)
    return ledger.read(lambda c: list(c.scalars(q)))


def save(ledger: Ledger, state: PushState) -> None:
    p = schema.push_state.c
    values = {
        "gpu_next": dict(state.gpu_next),
        "host_next": state.host_next,
        "event_next": state.event_next,
        "metric_next": state.metric_next,
        "run_sig": state.run_sig,
        "log_sig": state.log_sig,
        "done": state.done,
        "last_error": state.last_error,
        "updated_at": time.time(),
    }
    upd = sa.update(schema.push_state).where(p.server == state.server, p.run_id == state.run_id).values(values)
    ledger.write(lambda c: c.execute(upd))


def _plain_rows(rows: Iterable[Any]) -> list[dict[str, Any]]:
    """Row mappings as dicts with plain ``str`` keys (SQLAlchemy's are a str subclass)."""
    return [{str(k): v for k, v in r.items()} for r in rows]


def rows_after(ledger: Ledger, state: PushState, budget: int) -> dict[str, list[dict[str, Any]]]:
    """The run's rows beyond the watermarks, oldest seq first, at most ``budget`` intervals and
    ``budget`` events + metrics: keys gpu_intervals, host_intervals, events, metrics."""

    def tx(conn: Connection) -> dict[str, list[dict[str, Any]]]:
        g, h, e, m = schema.gpu_intervals, schema.host_intervals, schema.events, schema.metrics
        out: dict[str, list[dict[str, Any]]] = {"gpu_intervals": [], "host_intervals": []}
        left = budget
        devices = list(conn.scalars(sa.select(g.c.device_uuid).distinct().where(g.c.run_id == state.run_id)))
        for uuid in sorted(devices):
            if left <= 0:
                break
            q = (
                sa.select(*(c for c in g.c if c.name != "run_id"))
                .where(g.c.run_id == state.run_id, g.c.device_uuid == uuid, g.c.seq >= state.gpu_next.get(uuid, 0))
                .order_by(g.c.seq)
                .limit(left)
            )
            rows = _plain_rows(conn.execute(q).mappings())
            out["gpu_intervals"] += rows
            left -= len(rows)
        if left > 0:
            q = (
                sa.select(*(c for c in h.c if c.name != "run_id"))
                .where(h.c.run_id == state.run_id, h.c.seq >= state.host_next)
                .order_by(h.c.seq)
                .limit(left)
            )
            out["host_intervals"] = _plain_rows(conn.execute(q).mappings())
        for key, table, start in (("events", e, state.event_next), ("metrics", m, state.metric_next)):
            q = (
                sa.select(*(c for c in table.c if c.name != "run_id"))
                .where(table.c.run_id == state.run_id, table.c.seq >= start)
                .order_by(table.c.seq)
                .limit(budget)
            )
            out[key] = _plain_rows(conn.execute(q).mappings())
        return out

    return ledger.read(tx)
