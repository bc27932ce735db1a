"""What a bill says about runs metered from a replayed GPU trace (``--replay-gpus``).

Such a run is a demo or a test: its GPUs are fictional, so no bill, FOCUS dataset or capacity
report counts it unless the reader asks with ``--include-replayed``; then every row and total it
touches is marked. Either way the report says so, so a figure never silently differs.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuledger.core.ids import short_id

__all__ = ["REPLAYED_FLAG", "replayed_warning"]

REPLAYED_FLAG = "replayed"  # in a run's ``flags``; ``replayed_runs`` counts them in a group


def replayed_warning(ids: Sequence[str], included: bool) -> str:
    """The line a report shows about the replayed runs ``ids`` of its window."""
    shown = ", ".join(short_id(x) for x in ids[:5]) + (", ..." if len(ids) > 5 else "")
    n = len(ids)
    runs = "1 replayed run" if n == 1 else f"{n} replayed runs"
    if included:
        return (
            f"{runs} ({shown}) included and marked replayed: metered from a recorded GPU trace "
            "(--replay-gpus), not real hardware"
        )
    return (
        f"{runs} ({shown}) left out: metered from a recorded GPU trace (--replay-gpus), not real hardware, "
        "so not billed; --include-replayed puts them in, marked"
    )
