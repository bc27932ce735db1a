"""The ledger: the only code that talks SQL (SQLite locally, PostgreSQL for a team server).

The names below are loaded on first use (PEP 562), not when the package is imported: importing
``Ledger`` loads SQLAlchemy and the schema (a quarter of a second of CPU), which ``gpuledger run``
does not need when it writes a run with the standard ``sqlite3`` module (store/run_writer.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpuledger.store.errors import (
    AmbiguousRun,
    LedgerDenied,
    LedgerError,
    LedgerLocked,
    LedgerUnavailable,
    RunNotFound,
    SchemaOutdated,
    SchemaTooNew,
)

if TYPE_CHECKING:
    from gpuledger.store.ledger import Ledger
    from gpuledger.store.migrations import LATEST as SCHEMA_VERSION
    from gpuledger.store.url import data_dir, default_url, display_url, normalise_url

_LAZY = {
    "Ledger": ("gpuledger.store.ledger", "Ledger"),
    "SCHEMA_VERSION": ("gpuledger.store.version", "LATEST"),
    "data_dir": ("gpuledger.store.url", "data_dir"),
    "default_url": ("gpuledger.store.url", "default_url"),
    "display_url": ("gpuledger.store.url", "display_url"),
    "normalise_url": ("gpuledger.store.url", "normalise_url"),
}

__all__ = [
    "SCHEMA_VERSION",
    "AmbiguousRun",
    "Ledger",
    "LedgerDenied",
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


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    if name.startswith("__"):  # probes such as __wrapped__ name no submodule
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:  # ``gpuledger.store.schema`` and its siblings, as the eager import used to bind them
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
