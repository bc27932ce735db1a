"""The ledger: the only code that talks SQL (SQLite locally, PostgreSQL for a team server)."""

from gpuledger.store.errors import (
    AmbiguousRun,
    LedgerError,
    LedgerLocked,
    LedgerUnavailable,
    RunNotFound,
    SchemaOutdated,
    SchemaTooNew,
)
from gpuledger.store.ledger import Ledger
from gpuledger.store.migrations import LATEST as SCHEMA_VERSION
from gpuledger.store.url import data_dir, default_url, display_url, normalise_url

__all__ = [
    "SCHEMA_VERSION",
    "AmbiguousRun",
    "Ledger",
    "LedgerError",
    "LedgerLocked",
    "LedgerUnavailable",
    "RunNotFound",
    "SchemaOutdated",
    "SchemaTooNew",
    "data_dir",
    "default_url",
    "display_url",
    "normalise_url",
]
