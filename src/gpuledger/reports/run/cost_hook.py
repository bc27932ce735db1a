"""The one seam between the run reports and the cost engine (rate cards, run cost, value for money).

Reports show money only when a rate card is configured (``$GPULEDGER_RATES``, or ``--cost`` to use
the engine's example card); otherwise they show resource figures only (GPU-hours, energy). The
engine (reports/cost/run_money.py) is imported only when a report asks for money, and whatever it
raises, a report still renders: errors here become "no cost block". It provides:

- ``run_cost(ledger, run_id)``: the priced run; its ``total`` and ``currency`` are used.
- ``value_for_money(ledger, run_id)``: cost per mAP point and the like; without it, compare
  divides the run cost by the best mAP itself.
- ``run_cost_and_value(ledger, run_id)``: both from one pricing (the run report asks for both,
  handing over the GPU day sums its series pass made: store/cost_queries.summed_streams).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuledger.core.model import RunRecord
    from gpuledger.store import Ledger

MODULE = "gpuledger.reports.cost.run_money"  # imported only when a report asks for money
RATES_ENV = "GPULEDGER_RATES"  # the rate card file the cost engine prices with
TOTAL_KEYS = ("total", "cost", "amount", "total_cost")


def rate_card_configured(env: Mapping[str, str] | None = None) -> bool:
    """Reports price runs by default only with a rate card the user chose (``$GPULEDGER_RATES``):
    the cost engine's built-in example card is for trying it out, not for a report's figures."""
    return bool((os.environ if env is None else env).get(RATES_ENV))


def engine() -> Any:
    """The cost engine's module (imported once), or None when it cannot be imported."""
    try:
        return importlib.import_module(MODULE)
    except Exception:
        return None


def _call(name: str, ledger: Ledger, run: RunRecord, summed: Mapping[Any, Any] | None = None) -> Any:
    """``name(ledger, run_id)`` of the cost engine; None when it is absent or fails. ``summed``:
    GPU streams whose day sums the caller read already (store/cost_queries.summed_streams)."""
    try:
        fn = getattr(importlib.import_module(MODULE), name)
        if not summed:
            return fn(ledger, run.id)
        from gpuledger.store.cost_queries import summed_streams

        with summed_streams(dict(summed)):
            return fn(ledger, run.id)
    except Exception:  # a broken rate card, an engine error: the report renders without money
        return None


def jsonable(value: Any) -> Any:
    """Money stays exact: Decimal becomes its string; dataclasses and objects become dicts."""
    if isinstance(value, Decimal):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    for method in ("to_dict", "as_dict"):
        if hasattr(value, method) and callable(getattr(value, method)):
            return jsonable(getattr(value, method)())
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def run_cost(ledger: Ledger, run: RunRecord) -> dict[str, Any] | None:
    """The priced run as a JSON-able dict, or None (no cost engine, no rate card, or an error)."""
    result = jsonable(_call("run_cost", ledger, run))
    return result if isinstance(result, dict) and result else None


def run_cost_value(ledger: Ledger, run: RunRecord) -> tuple[float, str | None] | None:
    """(total, currency) of the run's cost, for sorting and ratios; None when not priced."""
    return cost_value(run_cost(ledger, run))


def cost_value(cost: Mapping[str, Any] | None) -> tuple[float, str | None] | None:
    if not cost:
        return None
    for key in TOTAL_KEYS:
        try:
            return float(cost[key]), cost.get("currency")
        except (KeyError, TypeError, ValueError):
            continue
    return None


def value_for_money(ledger: Ledger, run: RunRecord) -> dict[str, Any] | None:
    return _value(jsonable(_call("value_for_money", ledger, run)))


def _value(result: Any) -> dict[str, Any] | None:
    if isinstance(result, dict):
        return result
    if isinstance(result, int | float | str):
        return {"value": result}
    return None


def run_cost_and_value(
    ledger: Ledger, run: RunRecord, summed: Mapping[Any, Any] | None = None
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``(run_cost, value_for_money)`` from one pricing of the run when the engine offers it
    (``run_cost_and_value``: a big run's intervals are read once), else from both calls; the value
    is None whenever the cost is. ``summed``: the day sums of streams the report read already."""
    both = jsonable(_call("run_cost_and_value", ledger, run, summed))
    if not isinstance(both, dict):
        cost = run_cost(ledger, run)
        return cost, value_for_money(ledger, run) if cost else None
    cost = both.get("cost")
    cost = cost if isinstance(cost, dict) and cost else None
    return cost, _value(both.get("value")) if cost else None
