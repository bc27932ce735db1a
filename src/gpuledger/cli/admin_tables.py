"""The rows of ``gpuledger admin token list``, ``admin user list`` and ``admin gpu list``: columns and
cells for the CLI's one table renderer (cli/render.py), so that ids stay whole on any terminal and
piped output is not padded to its widest cell."""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING, Any

from gpuledger.cli.table_fit import Column

if TYPE_CHECKING:  # the CLI starts without the store loaded
    from gpuledger.store.accounts import TokenInfo


def when(t: float | None) -> str:
    return "" if t is None else dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M")


TOKEN_COLUMNS = (
    Column("ID", "key"),
    Column("USER", "text", priority=9, min_width=6),
    Column("ROLE", "key"),
    Column("STATUS", "key"),
    Column("PROJECTS", "text", priority=6, min_width=8),
    Column("HOST", "text", priority=7, min_width=8),
    Column("CREATED (UTC)", "number", priority=5),
    Column("EXPIRES (UTC)", "number", priority=3),
    Column("REVOKED (UTC)", "number", priority=4),
)


def token_status(t: TokenInfo, now: float) -> str:
    if t.revoked_at is not None:
        return "revoked"
    if t.expires_at is not None and t.expires_at <= now:
        return "expired"
    return "active"


def token_cells(t: TokenInfo, now: float | None = None) -> list[str]:
    # An admin reaches everything; a token without --projects reaches its user's memberships.
    scope = "(all)" if t.role == "admin" else ",".join(t.projects) if t.projects is not None else "(memberships)"
    status = token_status(t, time.time() if now is None else now)
    return [t.id, t.user, t.role, status, scope, t.host or "", when(t.created_at), when(t.expires_at),
            when(t.revoked_at)]  # fmt: skip


USER_COLUMNS = (
    Column("NAME", "key"),
    Column("STATUS", "key"),
    Column("CREATED (UTC)", "number", priority=5),
    Column("PROJECTS", "text", priority=9, min_width=8),
)


def user_cells(u: dict[str, Any]) -> list[str]:
    return [u["name"], "disabled" if u["disabled"] else "active", when(u.get("created_at")), ", ".join(u["projects"])]


GPU_COLUMNS = (
    Column("UUID", "key"),
    Column("HOST", "text", priority=9, min_width=10),
    Column("AGENT", "text", priority=7, min_width=6),
    Column("SINCE (UTC)", "number", priority=5),
    Column("SOURCE", "key"),  # enrolled, push (provisional) or admin: how much the owner is to be trusted
)


def gpu_cells(g: dict[str, Any]) -> list[str]:
    return [g["uuid"], g["host"], g["user_name"] or "(any)", when(g["since"]), g["source"]]
