"""Where the ledger lives: default location, URL normalisation and password-free display."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from gpuledger.paths import data_dir

if TYPE_CHECKING:  # SQLAlchemy is loaded by the functions that parse: gpuledger run may never need it
    from sqlalchemy.engine import URL

DB_FILENAME = "ledger.db"


def default_url(env: Mapping[str, str] | None = None) -> str:
    """The ledger to use when none is given: ``$GPULEDGER_DB`` (URL or path), else the local SQLite file."""
    env = os.environ if env is None else env
    configured = env.get("GPULEDGER_DB", "").strip()
    if configured:
        return normalise_url(configured)
    return normalise_url(str(data_dir(env) / DB_FILENAME))


def is_url(text: str) -> bool:
    return "://" in text


def normalise_url(url_or_path: str | os.PathLike[str]) -> str:
    """An SQLAlchemy URL string for a URL or a bare filesystem path.

    ``postgresql://`` / ``postgres://`` get the psycopg 3 driver (SQLAlchemy would pick psycopg2,
    which we do not depend on); a bare path becomes an absolute ``sqlite:///`` URL.
    """
    text = os.fspath(url_or_path).strip()
    if not is_url(text):
        path = Path(text).expanduser()
        return "sqlite:///" + str(path.absolute())
    scheme, rest = text.split("://", 1)
    if scheme in ("postgresql", "postgres"):
        return "postgresql+psycopg://" + rest
    return text


def parse(url: str) -> URL:
    from sqlalchemy.engine import make_url

    return make_url(normalise_url(url))


def display_url(url: str | URL) -> str:
    """The URL with its password masked, safe for messages and logs."""
    try:
        parsed = url if hasattr(url, "render_as_string") else parse(url)  # a URL already, or text to parse
    except Exception:  # an unparseable URL: show nothing that could be a secret
        return "<unparseable database URL>"
    return parsed.render_as_string(hide_password=True)


def sqlite_path(url: URL) -> Path | None:
    """The file of a SQLite URL, None for other backends and in-memory databases."""
    if url.get_backend_name() != "sqlite":
        return None
    db = url.database or ""
    if db in ("", ":memory:") or (db.startswith("file:") and "mode=memory" in db):
        return None
    return Path(db)
