"""A raw-series store chosen by URL (docs/SCALE.md, section 3), as the ledger is chosen by its URL:

- ``chdb:///abs/folder``: ClickHouse in-process (series/clickhouse.py);
- ``clickhouse://user:password@host:8123/db[?cluster=NAME]``: a ClickHouse server or cluster;
- ``postgresql://…[?schema=NAME]`` (or ``postgres://``, ``postgresql+psycopg://``): the compact
  PostgreSQL store (series/postgres.py) in schema ``series`` (or NAME) of that database.

Each store's package is imported only when its scheme is asked for, so one extra missing never
stops the other.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from gpuledger.series.base import SeriesStore

CLICKHOUSE_SCHEMES = ("chdb", "clickhouse")
POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")
SHAPES = "chdb:///abs/folder, clickhouse://user:password@host:8123/db or postgresql://user@host/db"


class BadSeriesUrl(ValueError):
    """A URL that names no series store gpuledger has."""


def _redacted(url: str) -> str:
    return re.sub(r"//([^:/@]*):[^@/]*@", r"//\1:***@", url)


def open_series(url: str, *, raw_days: int = 7) -> SeriesStore:
    """The store ``url`` names, not yet created (call ``create()``). ``raw_days``: the raw window
    of a ClickHouse store (its TTL); the PostgreSQL store drops days when told to."""
    if not isinstance(url, str) or "://" not in url:
        raise BadSeriesUrl(f"not a series store URL ({SHAPES}): {url!r}")
    scheme = urlsplit(url).scheme.lower()
    if scheme in CLICKHOUSE_SCHEMES:
        from gpuledger.series.clickhouse import ClickHouseSeries

        return ClickHouseSeries(url, raw_days=raw_days)
    if scheme in POSTGRES_SCHEMES:
        try:
            from gpuledger.series.postgres import PostgresSeries
        except ImportError as e:  # psycopg missing
            raise BadSeriesUrl(f"postgresql:// needs psycopg: pip install 'gpuledger[postgres]' ({e})") from e
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        schemas = [v for k, v in query if k == "schema"]
        rest = urlencode([(k, v) for k, v in query if k != "schema"])
        return PostgresSeries(urlunsplit(parts._replace(query=rest)), *schemas[-1:])
    raise BadSeriesUrl(f"no series store for scheme {scheme!r} in {_redacted(url)!r}; expected {SHAPES}")
