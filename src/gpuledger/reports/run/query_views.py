"""What ``gpuledger query`` shows, shaped from the ledger's audit queries (store/audit_queries.py).

- ``failure_report``: only failed, killed and lost runs are waste. Succeeded runs shorter than
  ``--short`` are listed beside them (a quick evaluation is not a failure, but a training that
  "succeeded" in seconds may be a misconfiguration worth a look), never added to the waste.
- ``mark_replayed``: each run row says whether it was metered from a replayed GPU trace, as every
  other surface does.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuledger.store import Ledger

SHORT = "short"


def failure_report(result: dict[str, Any]) -> dict[str, Any]:
    """``audit_queries.failures``' result with short succeeded runs taken out of the waste."""
    items = [{**item, "wasted": item["status"] != "succeeded"} for item in result["items"]]
    wasted = [i for i in items if i["wasted"]]
    short = [i for i in items if not i["wasted"]]
    causes: Counter[str] = Counter()
    hours: Counter[str] = Counter()
    for item in wasted:
        causes[item["cause"]] += 1
        hours[item["cause"]] += item["allocated_gpu_hours"]
    return {
        "runs": len(wasted),
        "by_status": dict(Counter(i["status"] for i in wasted)),
        "wasted_gpu_hours": sum(i["allocated_gpu_hours"] for i in wasted),
        "causes": [{"cause": c, "runs": n, "gpu_hours": hours[c]} for c, n in causes.most_common()],
        "short_seconds": result["short_seconds"],
        "short_runs": {"runs": len(short), "allocated_gpu_hours": sum(i["allocated_gpu_hours"] for i in short)},
        "items": items,
    }


def mark_replayed(ledger: Ledger, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row (with a run ``id``) gets ``replayed`` and ``short_id``."""
    from gpuledger.core.ids import short_id

    replayed = {run_id: ledger.get_run(run_id).replayed for run_id in {r["id"] for r in rows}}
    return [{**r, "short_id": short_id(r["id"]), "replayed": replayed[r["id"]]} for r in rows]
