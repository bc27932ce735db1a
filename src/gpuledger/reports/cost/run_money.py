"""The seam the run reports use to show money (reports/run/cost_hook.py looks these names up).

``run_cost(ledger, run)`` and ``value_for_money(ledger, run)`` price one run with the rate card
in ``GPULEDGER_RATES`` (or the example card). The caller has already been allowed to see the run;
its own attempts (a resumed training) are priced with it, whatever their project label.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from gpuledger.reports.cost.costing import load_rate_card, run_costs, run_value

if TYPE_CHECKING:
    from gpuledger.core.model import RunRecord
    from gpuledger.store import Ledger

__all__ = ["run_cost", "run_cost_and_value", "value_for_money"]


def _id(run: str | RunRecord) -> str:
    return run if isinstance(run, str) else run.id


def run_cost(ledger: Ledger, run: str | RunRecord) -> dict[str, Any]:
    """The run's cost row (docs/CHARGEBACK.md, cost columns) plus ``total`` (the cost, a decimal
    string), ``currency``, ``basis``, ``rate_card``, ``gpus`` (per GPU rows), ``logical_run``."""
    card = load_rate_card(os.environ.get("GPULEDGER_RATES"))
    return _cost_entry(run_costs(ledger, [_id(run)], scope=None, card=card))


def run_cost_and_value(ledger: Ledger, run: str | RunRecord) -> dict[str, Any]:
    """``{"cost": run_cost(...), "value": value_for_money(...)}`` from one pricing of the run (a
    72-hour, 8-GPU run's intervals are read once, not once for each). ``value`` is None when it
    cannot be computed; the cost's errors are raised."""
    card = load_rate_card(os.environ.get("GPULEDGER_RATES"))
    report = run_costs(ledger, [_id(run)], scope=None, card=card)
    try:
        value: dict[str, Any] | None = run_value(ledger, _id(run), scope=None, card=card, costs=report).as_dict()
    except Exception:  # the cost block still renders, as with value_for_money failing alone
        value = None
    return {"cost": _cost_entry(report), "value": value}


def _cost_entry(report: dict[str, Any]) -> dict[str, Any]:
    entry = report["runs"][0]
    return {
        **entry["total"],
        "total": entry["total"]["cost"],
        "currency": report["currency"],
        "basis": report["basis"],
        "rate_card": report["rate_card"],
        "partial": entry["partial"],
        "billed": entry["billed"],  # false for a replayed GPU trace's run: no bill counts it
        "gpus": entry["gpus"],
        "logical_run": entry["logical_run"],
    }


def value_for_money(ledger: Ledger, run: str | RunRecord) -> dict[str, Any]:
    """Cost per epoch, per 1,000 training images and per mAP50-95 point, over all attempts
    (core/chargeback/value.py); money as decimal strings."""
    card = load_rate_card(os.environ.get("GPULEDGER_RATES"))
    return run_value(ledger, _id(run), scope=None, card=card).as_dict()
