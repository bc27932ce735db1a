"""The ledger's own exception tree: SQL driver errors are translated into these at the boundary.

Every message says what went wrong *and* what to do about it, so a surface can print ``str(exc)``
as is.
"""

from __future__ import annotations

from collections.abc import Callable


class LedgerError(Exception):
    """Base class of every error the ledger raises on purpose."""


class RunNotFound(LedgerError):
    """No run matches the id or prefix."""

    def __init__(self, ref: str, hint: str = "") -> None:
        self.ref = ref
        msg = f"no run matches {ref!r}"
        msg += f": {hint}" if hint else "; check the id (list the runs to find it)"
        super().__init__(msg)


class AmbiguousRun(LedgerError):
    """A prefix matches several runs; ``candidates`` holds (some of) their ids, newest first."""

    def __init__(self, ref: str, candidates: list[str], more: bool = False) -> None:
        self.ref = ref
        self.candidates = candidates
        listed = ", ".join(candidates) + (", ..." if more else "")
        super().__init__(f"{ref!r} matches several runs ({listed}); use a longer prefix or the full id")


class LedgerLocked(LedgerError):
    """The SQLite file stayed locked by other writers past the timeout and the retries.

    Nothing was written; the caller keeps its data buffered and tries again later.
    """


class SchemaOutdated(LedgerError):
    """The database schema is older than this code and migrating was not allowed."""


class SchemaTooNew(LedgerError):
    """The database was migrated by a newer gpuledger than this one."""


class LedgerUnavailable(LedgerError):
    """The database cannot be reached or opened (server down, bad URL, missing driver, bad path)."""


class LedgerDenied(LedgerError):
    """The database answers but refuses this user: a privilege it lacks, or a schema (PostgreSQL's
    search_path) that does not exist or that it may not use."""


class PrepareFirst(Exception):
    """Raised inside a ``Database.write`` transaction that needs something done first in a
    transaction of its own (a day partition its rows need, store/partition_days.py). ``Database``
    rolls the transaction back, calls ``first()`` and runs the transaction again; callers never see
    it. ``first`` must leave the next attempt with no reason to raise it again for the same thing."""

    def __init__(self, first: Callable[[], object], why: str) -> None:
        super().__init__(why)
        self.first = first
