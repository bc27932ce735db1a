"""How many rows one push (``POST /api/v1/ingest``) may carry, per kind.

The body limit (8 MiB) bounds a push's bytes, not its work: 60,000 tiny events fit in it and held
a server worker for half a minute. So each kind has its own cap; a push over one is refused whole
with 413 and a message naming the cap (server/batch_check.py), before anything is stored. The agent
(agent/outbox.py) never sends more than these, and an older agent that does gets 413 and sends its
batch again in smaller pieces. docs/SERVER.md lists the numbers.
"""

from __future__ import annotations

MAX_INTERVALS = 20_000  # GPU and host intervals together (gpu_rows, gpu_intervals, host_rows, host_intervals)
MAX_EVENTS = 10_000
MAX_METRICS = 10_000

INTERVAL_LISTS = ("gpu_rows", "gpu_intervals", "host_rows", "host_intervals")


def over_caps(counts: dict[str, int]) -> str | None:
    """Why a push of ``counts`` rows per list is too large, or None when it fits."""
    intervals = sum(counts.get(k, 0) for k in INTERVAL_LISTS)
    for what, n, cap in (
        ("intervals", intervals, MAX_INTERVALS),
        ("events", counts.get("events", 0), MAX_EVENTS),
        ("metrics", counts.get("metrics", 0), MAX_METRICS),
    ):
        if n > cap:
            return f"a push carries at most {cap:,} {what}; this one has {n:,} (send them in several pushes)"
    return None


def fitting_budget(budget: int) -> int:
    """An agent's rows-per-push budget lowered to what every cap allows."""
    return max(1, min(budget, MAX_INTERVALS, MAX_EVENTS, MAX_METRICS))
