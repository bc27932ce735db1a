"""Server settings: limits and knobs, with defaults that suit a team server (docs/SERVER.md lists
them all). Every field can be set from the environment as ``GPULEDGER_<FIELD>`` (upper case), which
is how ``gpuledger serve`` hands them to its worker processes."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

MiB = 1024 * 1024


@dataclass(frozen=True)
class Settings:
    # Bodies
    max_body_b: int = 8 * MiB  # any request body larger than this is answered 413
    max_log_b: int = 96 * MiB  # PUT /runs/{id}/log (a stored log is at most 64 MiB plus a note)
    body_timeout_s: float = 300.0  # a whole body must arrive within this (408 after)
    body_idle_s: float = 30.0  # ... and no pause between two of its chunks longer than this
    header_timeout_s: float = 10.0  # request line and headers (gpuledger serve's HTTP protocol)
    # Tokens
    token_cache_s: float = 5.0  # a revoked token may work this much longer on a replica
    token_cache_size: int = 4096  # valid tokens kept (LRU); failed lookups have their own LRU
    # Rate limits (token buckets per process; a rate of 0 turns a limit off)
    rate_token_per_s: float = 20.0  # requests per second per token, sustained
    rate_token_burst: float = 200.0  # ... and in a burst
    rate_ip_per_s: float = 50.0  # requests per second per client address (any token, or none)
    rate_ip_burst: float = 500.0
    # Reads
    max_page: int = 20_000  # most interval rows per series in one /intervals answer
    max_streams: int = 4  # exports and interval pages streamed at once per process (429 beyond)
    stream_rows: int = 2_000  # rows fetched per round trip from the database cursor of a stream
    log_writes: int = 2  # log uploads stored at once per process (each holds its log in memory once)
    # Liveness: a running run whose agent has pushed nothing for this long becomes "lost"
    lost_after_s: float = 3600.0  # 0: never
    sweep_every_s: float = 60.0  # how often each server process looks for silent runs
    sweep_delay_s: float = 300.0  # the first look after a start: agents that waited out an outage push first
    # PostgreSQL: day partitions of the raw intervals created ahead, strays moved out of the default
    # partition (store/partitions.py), at start and this often; 0: never
    partition_every_s: float = 3600.0
    # Closed months (store/closed_months.py): a month's bill is final this many days after it ends
    close_after_days: float = 3.0
    checkpoint_every_s: float = 5.0  # how often the audit checkpoint is brought up to the signed head
    rates: str | None = None  # rate card file for /reports/chargeback (None: the default card)
    # a series store raw days were tiered into (store/series_tier.py): run reads merge them back
    series: str | None = None
    # write each push's new intervals into that store before acknowledging it (store/series_live.py)
    series_live: bool = False
    # and more: runs created by this server keep their raw intervals in that store only, the
    # ledger their seq ranges (store/series_segments.py); implies series_live
    series_only: bool = False
    # ClickHouse: concurrent pushes' rows written by one insert once this many rows wait, or this
    # long after the first, or when no other push is on its way (store/series_batch.py); 0 rows:
    # one insert per push
    series_batch_rows: int = 10_000
    series_batch_ms: float = 1000.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Defaults, overridden by GPULEDGER_<FIELD> variables; a bad value names the variable."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for f in dataclasses.fields(cls):
            name = f"GPULEDGER_{f.name.upper()}"
            text = env.get(name)
            if text is None or text == "":
                continue
            kind = type(f.default) if f.default is not None else str
            if kind is bool:
                values[f.name] = _flag(name, text)
                continue
            try:
                values[f.name] = kind(float(text)) if kind in (int, float) else text
            except ValueError:
                raise SystemExit(f"{name}={text!r}: expected a number") from None
        return cls(**values)  # type: ignore[arg-type]


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _flag(name: str, text: str) -> bool:
    """An on/off variable: 1/true/yes/on or 0/false/no/off (any case); anything else names it."""
    if text.strip().lower() in _TRUE:
        return True
    if text.strip().lower() in _FALSE:
        return False
    raise SystemExit(f"{name}={text!r}: expected 1 or 0 (true/false, yes/no, on/off)")


# Read by the environment-only code path (the HTTP protocol class, which uvicorn creates itself).
HEADER_TIMEOUT_ENV = "GPULEDGER_HEADER_TIMEOUT_S"
