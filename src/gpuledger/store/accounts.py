"""Users, projects, memberships and API tokens of a team ledger (the SQL side of access control).

A token is ``glt_<id>_<secret>``: the id (12 hex chars, public, shown in lists) finds the row; only
the sha256 of the 32-byte random secret is stored and compared in constant time. The token text is
returned once, by ``issue_token``, and never again. Every change is appended to the audit chain in
the same transaction, with what ``gpuledger audit verify`` checks the tables against (store/audit_state.py).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.audit.access import Principal, check_name, check_role, format_token, parse_token
from gpuledger.store import audit, schema
from gpuledger.store.audit_state import secret_check
from gpuledger.store.errors import LedgerError

if TYPE_CHECKING:
    from gpuledger.store.ledger import Ledger


class AccountError(LedgerError):
    """A user, project or token that does not exist or already exists."""


@dataclass(frozen=True)
class TokenInfo:
    id: str
    user: str
    role: str
    projects: list[str] | None
    note: str | None
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    host: str | None = None


def _sha(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def _exists(conn: Connection, table: sa.Table, col: str, value: str) -> bool:
    return conn.execute(sa.select(table.c[col]).where(table.c[col] == value)).first() is not None


def add_user(ledger: Ledger, name: str, *, actor: str) -> None:
    check_name("user", name)

    def tx(conn: Connection) -> None:
        if _exists(conn, schema.users, "name", name):
            raise AccountError(f"user {name!r} already exists")
        conn.execute(sa.insert(schema.users).values(name=name, created_at=time.time(), disabled=False))
        audit.append(conn, actor=actor, action="user.added", obj=f"user:{name}")

    ledger.write(tx)


def add_project(ledger: Ledger, name: str, *, actor: str) -> None:
    check_name("project", name)

    def tx(conn: Connection) -> None:
        if _exists(conn, schema.projects, "name", name):
            raise AccountError(f"project {name!r} already exists")
        conn.execute(sa.insert(schema.projects).values(name=name, created_at=time.time()))
        audit.append(conn, actor=actor, action="project.added", obj=f"project:{name}")

    ledger.write(tx)


def add_member(ledger: Ledger, user: str, project: str, *, actor: str) -> None:
    def tx(conn: Connection) -> None:
        if not _exists(conn, schema.users, "name", user):
            raise AccountError(f"no user {user!r}; add it with: gpuledger admin user add {user}")
        if not _exists(conn, schema.projects, "name", project):
            raise AccountError(f"no project {project!r}; add it with: gpuledger admin project add {project}")
        m = schema.memberships.c
        if conn.execute(sa.select(m.user_name).where(m.user_name == user, m.project == project)).first():
            return
        conn.execute(sa.insert(schema.memberships).values(user_name=user, project=project))
        audit.append(conn, actor=actor, action="member.added", obj=f"project:{project}", payload={"user": user})

    ledger.write(tx)


def remove_member(ledger: Ledger, user: str, project: str, *, actor: str) -> bool:
    def tx(conn: Connection) -> bool:
        m = schema.memberships.c
        gone = conn.execute(sa.delete(schema.memberships).where(m.user_name == user, m.project == project)).rowcount
        if gone:
            audit.append(conn, actor=actor, action="member.removed", obj=f"project:{project}", payload={"user": user})
        return bool(gone)

    return ledger.write(tx)


def list_users(ledger: Ledger) -> list[dict[str, Any]]:
    def tx(conn: Connection) -> list[dict[str, Any]]:
        members: dict[str, list[str]] = {}
        for row in conn.execute(sa.select(schema.memberships).order_by(schema.memberships.c.project)):
            members.setdefault(row.user_name, []).append(row.project)
        users = conn.execute(sa.select(schema.users).order_by(schema.users.c.name)).mappings()
        return [{**dict(u), "projects": members.get(u["name"], [])} for u in users]

    return ledger.read(tx)


def list_projects(ledger: Ledger) -> list[str]:
    return ledger.read(lambda c: list(c.scalars(sa.select(schema.projects.c.name).order_by(schema.projects.c.name))))


def issue_token(
    ledger: Ledger,
    user: str,
    *,
    role: str,
    actor: str,
    projects: Iterable[str] | None = None,
    note: str | None = None,
    expires_at: float | None = None,
    create_user: bool = False,
    host: str | None = None,
) -> tuple[str, str]:
    """A new token for ``user``: (token id, token text). The text is not stored: show it once.
    ``projects`` narrows the token to those projects (each must exist); ``create_user`` adds the
    user first when missing (the first admin token of a fresh server); ``host`` enrolls a machine:
    an agent token bound to it is the only kind that registers that host's GPUs and pushes its
    capacity (store/ownership.py)."""
    check_role(role)
    if host is not None:
        check_name("host", host)
        if role != "agent":
            raise AccountError(f"only agent tokens are bound to a host (this one is {role!r}); drop --host")
    wanted = None if projects is None else sorted({check_name("project", p) for p in projects})
    token_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)

    def tx(conn: Connection) -> None:
        if not _exists(conn, schema.users, "name", user):
            if not create_user:
                raise AccountError(f"no user {user!r}; add it with: gpuledger admin user add {user}")
            check_name("user", user)
            conn.execute(sa.insert(schema.users).values(name=user, created_at=time.time(), disabled=False))
            audit.append(conn, actor=actor, action="user.added", obj=f"user:{user}")
        for p in wanted or ():
            if not _exists(conn, schema.projects, "name", p):
                raise AccountError(f"no project {p!r}; add it with: gpuledger admin project add {p}")
        conn.execute(
            sa.insert(schema.api_tokens).values(
                id=token_id,
                user_name=user,
                role=role,
                projects=wanted,
                secret_sha256=_sha(secret),
                note=note,
                created_at=time.time(),
                expires_at=expires_at,
                revoked_at=None,
                host=host,
            )
        )
        # Everything verify checks the row against; of the secret only a hash of its hash.
        payload = {"user": user, "role": role, "projects": wanted, "expires_at": expires_at,
                   "secret": secret_check(_sha(secret)), "host": host}  # fmt: skip
        audit.append(conn, actor=actor, action="token.issued", obj=f"token:{token_id}", payload=payload)

    ledger.write(tx)
    return token_id, format_token(token_id, secret)


def revoke_token(ledger: Ledger, token_id: str, *, actor: str) -> None:
    def tx(conn: Connection) -> None:
        t = schema.api_tokens.c
        row = conn.execute(sa.select(t.revoked_at).where(t.id == token_id)).first()
        if row is None:
            raise AccountError(f"no token {token_id!r} (see: gpuledger admin token list)")
        if row.revoked_at is not None:
            return
        now = time.time()
        conn.execute(sa.update(schema.api_tokens).where(t.id == token_id).values(revoked_at=now))
        audit.append(conn, actor=actor, action="token.revoked", obj=f"token:{token_id}", payload={"revoked_at": now})

    ledger.write(tx)


def list_tokens(ledger: Ledger) -> list[TokenInfo]:
    t = schema.api_tokens.c
    cols = (t.id, t.user_name, t.role, t.projects, t.note, t.created_at, t.expires_at, t.revoked_at, t.host)
    rows = ledger.read(lambda c: list(c.execute(sa.select(*cols).order_by(t.created_at))))
    return [TokenInfo(*row) for row in rows]


def authenticate(conn: Connection, token_text: str, *, now: float | None = None) -> Principal | None:
    """The principal of a valid, unrevoked, unexpired token of an enabled user; else None."""
    parsed = parse_token(token_text)
    if parsed is None:
        return None
    token_id, secret = parsed
    t, u = schema.api_tokens.c, schema.users.c
    q = sa.select(
        t.user_name, t.role, t.projects, t.secret_sha256, t.expires_at, t.revoked_at, t.host, u.disabled
    ).join(schema.users, u.name == t.user_name)
    row = conn.execute(q.where(t.id == token_id)).first()
    if row is None or not hmac.compare_digest(row.secret_sha256, _sha(secret)):
        return None
    now = time.time() if now is None else now
    if row.revoked_at is not None or row.disabled or (row.expires_at is not None and row.expires_at <= now):
        return None
    if row.role == "admin":
        return Principal(row.user_name, "admin", None, token_id)
    m = schema.memberships.c
    member_of = frozenset(conn.scalars(sa.select(m.project).where(m.user_name == row.user_name)))
    projects = member_of if row.projects is None else frozenset(row.projects)
    if row.role == "member" and row.projects is not None:
        projects = projects & member_of  # a token never reaches beyond its user's projects
    return Principal(row.user_name, row.role, projects, token_id, row.host)
