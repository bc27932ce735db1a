"""Pushing a node's capacity intervals and GPU sightings to the team server (``POST
/api/v1/capacity``), from the local ledger's capacity outbox (store/capacity_push.py).

Called with the runs' push (node/push.py, and ``gpuledger sync``): batches of up to ``BATCH_ROWS``
intervals until none is left; the watermarks move only after the server acknowledged a batch. A
server older than the capacity ledger answers 404: the rows stay in the local ledger (reported as
``unsupported``) and the runs are pushed as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuledger.agent.client import Client, Rejected
from gpuledger.store import capacity_push

if TYPE_CHECKING:
    from gpuledger.store import Ledger

__all__ = ["BATCH_ROWS", "CapacityPush", "push_capacity"]

BATCH_ROWS = 5000  # ~0.6 MB of JSON per batch: well under the server's body limit


@dataclass
class CapacityPush:
    rows: int = 0
    batches: int = 0
    unsupported: bool = False  # the server has no capacity route (an older gpuledger)
    # rows the server set aside (an overlap, a time before the GPU's first sighting), with why:
    # acknowledged all the same, as sending them again could not change the answer
    set_aside: list[dict[str, Any]] = field(default_factory=list)


def push_capacity(ledger: Ledger, client: Client, *, budget: int = BATCH_ROWS) -> CapacityPush:
    """Push every interval the server has not acknowledged. Unreachable / Unauthorized propagate
    (nothing is lost: the next push starts at the watermarks); a refusal other than 404 too."""
    out = CapacityPush()
    while True:
        rows, gpus = capacity_push.pending(ledger, client.server, budget)
        if not rows:
            return out
        try:
            answer = client.capacity({"intervals": rows, "gpus": gpus})
        except Rejected as exc:
            if exc.status == 404:
                out.unsupported = True
                return out
            raise
        out.set_aside += (answer.get("quarantined") if isinstance(answer, dict) else None) or []
        marks: dict[str, int] = {}
        for row in rows:
            marks[row[0]] = max(marks.get(row[0], 0), row[2] + 1)  # the next start not yet acknowledged
        capacity_push.acknowledge(ledger, client.server, marks)
        out.rows += len(rows)
        out.batches += 1
        if len(rows) < budget:
            return out
