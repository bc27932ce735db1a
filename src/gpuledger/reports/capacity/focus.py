"""The capacity report as a FOCUS 1.0 dataset (docs/FOCUS.md): the fleet read exactly as the capacity
report reads it, priced by the same code, each priced piece kept with its GPU, day and price."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuledger.core.capacity.focus import capacity_rows
from gpuledger.core.capacity.pools import Pools
from gpuledger.core.capacity.report import build_capacity
from gpuledger.core.chargeback.focus import FocusExport, FocusIdentity
from gpuledger.core.pricing.ratecard import RateCard

# The capacity report's own read (agent-seen GPUs and those derived from runs, their day rows):
# the same data, so the rows add up to the report's fleet cost.
from gpuledger.reports.capacity.report import _read as read_fleet
from gpuledger.reports.capacity.report import replayed_gpus
from gpuledger.reports.cost.focus import default_identity

if TYPE_CHECKING:
    from gpuledger.store import Ledger

__all__ = ["capacity_focus"]


def capacity_focus(
    ledger: Ledger,
    *,
    card: RateCard,
    pools: Pools,
    start: float,
    end: float,
    identity: FocusIdentity | None = None,
    include_replayed: bool = False,
) -> FocusExport:
    """FOCUS rows of the fleet over [start, end) (whole UTC days): per day, GPU, host, price and state.
    A replayed GPU trace's GPUs are in it only with ``include_replayed`` (x_Flags ``replayed``)."""
    gpus, rows = read_fleet(ledger, card, start, end, replayed=include_replayed)
    pieces: list[tuple[Any, ...]] = []
    build_capacity(
        gpus=gpus, day_rows=rows, card=card, pools=pools, start=start, end=end, by=("host",), on_piece=pieces.append
    )
    fleet = {g.uuid: g for g in gpus}
    export = capacity_rows(pieces, fleet, card=card, start=start, end=end, identity=identity or default_identity(card))
    demo = replayed_gpus(ledger, gpus, start, end) if include_replayed else set()
    for row in export.rows:  # a replayed trace's GPU is no hardware: every row of it says so
        if row["ResourceId"] in demo:
            row["x_Flags"] = ";".join(sorted({*(row["x_Flags"] or "").split(";"), "replayed"} - {""}))
    return export
