"""Server settings: limits and knobs, with defaults that suit a team server."""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024


@dataclass(frozen=True)
class Settings:
    max_body_b: int = 8 * MiB  # any request body larger than this is answered 413
    max_log_b: int = 96 * MiB  # PUT /runs/{id}/log (a stored log is at most 64 MiB plus a note)
    token_cache_s: float = 5.0  # a revoked token may work this much longer on a replica
    rates: str | None = None  # rate card file for /reports/chargeback (None: the default card)
    max_page: int = 100_000  # most interval rows per series in one /intervals answer
