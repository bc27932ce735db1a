"""The fleet inventory's rows (``gpuledger report fleet``): each physical GPU with its model,
hosts, pool, the rate-card line that prices it and whether it is still seen. Pure.

Status of a GPU agents watch: ``present`` when its host's agent last reported it with the others;
``missing`` when that agent reported later without it (removed, fallen off the bus, moved to a
host without an agent); ``silent`` when its host has said nothing for ``SILENT_AFTER_S``. A GPU
known only from runs reads ``in use`` while a run on it is open, else ``runs only``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from gpuledger.core.capacity.model import FleetGpu
from gpuledger.core.capacity.pools import Pools
from gpuledger.core.pricing.ratecard import RateCard, RateLine

__all__ = ["SILENT_AFTER_S", "fleet_rows", "price_line"]

SILENT_AFTER_S = 900.0  # an agent writes every interval (at most 60 s): 15 minutes of silence is an outage
SAME_REPORT_S = 120.0  # sightings of one agent's GPUs end within an interval of each other


def price_line(line: RateLine | None) -> str:
    """How a GPU is priced, in words: the card's line, where it is written, how its rate was derived."""
    if line is None:
        return "unpriced"
    what = f"instance {line.key}" if line.kind == "instance" else f"gpu {line.key}"
    how = f": {line.derivation}" if line.derivation else ""
    where = f" ({line.where})" if line.where else ""
    return f"{what}{how}{where}"


def fleet_rows(gpus: Iterable[FleetGpu], *, card: RateCard, pools: Pools, now: float) -> list[dict[str, Any]]:
    """One row per GPU (core/capacity/columns.COLUMNS["fleet"]), by host then UUID."""
    gpus = list(gpus)
    host_latest: dict[str, float] = {}
    for g in gpus:
        if g.source == "agent":
            host_latest[g.host] = max(host_latest.get(g.host, g.last_seen), g.last_seen)
    rows = []
    for g in sorted(gpus, key=lambda g: (g.host, g.uuid)):
        model = card.models.match(g.name) or g.name
        instance = pools.instance_type(g.host, g.instance_on(g.host))
        line = card.line_at(model, instance, min(now, g.last_seen))
        rows.append({
            "gpu": g.uuid,
            "name": g.name,
            "gpu_model": model,
            "host": g.host,
            "hosts": " > ".join(h.host for h in sorted(g.hosts, key=lambda h: h.first_seen)) or g.host,
            "pool": pools.name(g.host, instance, model),
            "instance_type": instance,
            "price_line": price_line(line),
            "rate": None if line is None else format(line.rate, "f"),
            "first_seen": _iso(g.first_seen),
            "last_seen": _iso(g.last_seen),
            "status": _status(g, host_latest, now),
            "source": g.source,
        })  # fmt: skip
    return rows


def _status(g: FleetGpu, host_latest: dict[str, float], now: float) -> str:
    if g.source != "agent":
        return "in use" if g.last_seen >= now else "runs only"
    if host_latest.get(g.host, g.last_seen) - g.last_seen > SAME_REPORT_S:
        return "missing"
    if now - g.last_seen > SILENT_AFTER_S:
        return "silent"
    return "present"


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
