"""Who may see and write what (pure): principals, roles, project scopes, token text.

Roles: ``admin`` sees and writes everything; ``member`` reads the runs of the projects they belong
to; ``agent`` writes runs of its projects (a run's ``project`` label decides) and reads nothing
but itself. A run without a project label is visible to admins only.
"""

from __future__ import annotations

from dataclasses import dataclass

ROLES = ("admin", "member", "agent")
TOKEN_PREFIX = "glt_"
TOKEN_ID_LEN = 12  # hex chars of the public token id
MAX_NAME_LEN = 128


@dataclass(frozen=True)
class Principal:
    user: str
    role: str  # admin | member | agent
    projects: frozenset[str] | None  # None: every project (admins)
    token_id: str = ""
    host: str | None = None  # the machine an agent token is bound to (None: not bound)

    @property
    def scope(self) -> frozenset[str] | None:
        """The projects this principal may read (None: all), as report functions take it."""
        if self.role == "admin":
            return None
        if self.role == "agent":
            return frozenset()
        return self.projects if self.projects is not None else frozenset()

    def can_read(self, project: str | None) -> bool:
        scope = self.scope
        return scope is None or (project is not None and project in scope)

    def can_write(self, project: str | None) -> bool:
        if self.role == "admin":
            return True
        if self.role != "agent":
            return False
        return project is not None and self.projects is not None and project in self.projects


def check_name(kind: str, name: str) -> str:
    """A user or project name: 1-128 characters, no control characters. Anything else is kept as
    typed (quotes, markup and SQL are just text)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{kind} name must not be empty")
    if len(name) > MAX_NAME_LEN:
        raise ValueError(f"{kind} name is longer than {MAX_NAME_LEN} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        raise ValueError(f"{kind} name must not contain control characters")
    return name


def check_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; use one of {', '.join(ROLES)}")
    return role


def format_token(token_id: str, secret: str) -> str:
    return f"{TOKEN_PREFIX}{token_id}_{secret}"


def parse_token(text: str) -> tuple[str, str] | None:
    """(token id, secret) of a well-formed token, else None."""
    text = text.strip()
    head = len(TOKEN_PREFIX) + TOKEN_ID_LEN
    if not text.startswith(TOKEN_PREFIX) or len(text) < head + 2 or text[head] != "_":
        return None
    token_id, secret = text[len(TOKEN_PREFIX) : head], text[head + 1 :]
    if not all(c in "0123456789abcdef" for c in token_id):
        return None
    return token_id, secret
