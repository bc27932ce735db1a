"""How the ledger writes a JSON column: one function for SQLAlchemy's engine (store/engine.py) and
for the standard-library writer of ``gpuledger run`` (store/run_writer.py), so both store the same text."""

from __future__ import annotations

import json
import math
from typing import Any


def dumps(obj: Any) -> str:
    """JSON for the database: non-finite floats become "NaN"/"Infinity" strings (jsonb and strict
    JSON reject the bare tokens), anything else unknown becomes its ``str`` so that an odd event
    payload can never make a write fail."""
    try:
        return json.dumps(obj, allow_nan=False, default=str)
    except ValueError:
        return json.dumps(_finite(obj), allow_nan=False, default=str)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
