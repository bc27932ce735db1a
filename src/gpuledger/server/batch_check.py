"""Partial acceptance of a push: the run record must be valid, each row is judged on its own.

One bad interval used to refuse the whole batch (422), and the agent, resending the same batch,
was refused again forever. Now a batch is checked in two tiers:

- the run record, its devices and the batch's shape (unknown fields, lists that are not lists):
  any problem there refuses the batch (``BatchInvalid``, answered 422), because nothing can be
  stored without a valid run;
- each interval, event and metric on its own: a bad one is set aside (``Refused``: its list, its
  position, what it said it was and why) and the rest is stored. The route keeps the refused rows
  in the quarantine table and lists them in its answer, so the agent can move on.

The common case costs nothing extra: the whole body is validated in one pass by pydantic's JSON
parser; only when that finds a problem inside the row lists (or a NUL character) is the body parsed
again loosely and validated row by row.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from gpuledger.core import push_caps
from gpuledger.server.models import DeviceIn, EventIn, GpuIntervalIn, HostIntervalIn, IngestBatch, MetricIn, RunIn
from gpuledger.server.rows import GpuRow, HostRow, gpu_tuple, host_tuple, row_problems
from gpuledger.server.wire_types import FUTURE_SKEW_S

MAX_ERRORS = 20  # errors listed in a 422

# \u0000 in a JSON string (an escaped backslash before it does not count): text columns cannot hold NUL.
_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
_NUL_MSG = "strings must not contain NUL (\\u0000)"

ROW_TYPES: dict[str, Any] = {
    "gpu_rows": GpuRow,
    "host_rows": HostRow,
    "gpu_intervals": GpuIntervalIn,
    "host_intervals": HostIntervalIn,
    "events": EventIn,
    "metrics": MetricIn,
}
_ADAPTERS = {name: TypeAdapter(kind) for name, kind in ROW_TYPES.items()}


class TooManyRows(Exception):
    """More rows of a kind than one push may carry (core/push_caps.py): answered 413, nothing stored."""


class BatchInvalid(Exception):
    """The run record, the devices or the batch's shape is wrong: nothing of it can be stored."""

    def __init__(self, detail: list[dict[str, Any]]) -> None:
        super().__init__(detail)
        self.detail = detail[:MAX_ERRORS]


@dataclass(frozen=True)
class Refused:
    series: str
    index: int
    item: str
    reason: str
    raw: Any  # the row as sent (JSON value), kept in the quarantine


@dataclass
class CheckedBatch:
    batch: IngestBatch  # the run record and only the rows that passed
    refused: list[Refused]


class _LooseBatch(BaseModel):
    """The batch with its row lists unvalidated: the second pass, row by row."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=True)  # a NaN in a row is that row's problem
    run: RunIn
    devices: list[DeviceIn] = Field(default_factory=list, max_length=4096)
    gpu_intervals: list[Any] = Field(default_factory=list)
    host_intervals: list[Any] = Field(default_factory=list)
    gpu_rows: list[Any] = Field(default_factory=list)
    host_rows: list[Any] = Field(default_factory=list)
    events: list[Any] = Field(default_factory=list)
    metrics: list[Any] = Field(default_factory=list)
    final: bool = False


def _errors(exc: ValidationError) -> list[dict[str, Any]]:
    detail = exc.errors(include_url=False, include_context=False, include_input=False)
    for err in detail:
        err["loc"] = ["body", *err.get("loc", ())]
    return detail


def _in_a_row(loc: tuple[Any, ...] | list[Any]) -> bool:
    return len(loc) >= 3 and loc[1] in ROW_TYPES and isinstance(loc[2], int)


def check(body: bytes, now: float) -> CheckedBatch:
    """The batch's valid part and its refused rows; ``BatchInvalid`` when the run cannot be stored."""
    nul = b"\\u0000" in body and _NUL.search(body) is not None  # the plain test first: the regex is slow on MBs
    if not nul:
        try:
            batch = IngestBatch.model_validate_json(body)
        except ValidationError as exc:
            detail = _errors(exc)
            outside = [e for e in detail if not _in_a_row(e["loc"])]
            if outside:
                raise BatchInvalid(outside) from None
        else:
            _check_caps(batch)
            return _cross_checked(batch, {}, [], now)
    return _row_by_row(body, now)


def _check_caps(batch: BaseModel) -> None:
    why = push_caps.over_caps({series: len(getattr(batch, series)) for series in ROW_TYPES})
    if why is not None:
        raise TooManyRows(why)


def _row_by_row(body: bytes, now: float) -> CheckedBatch:
    try:
        loose = _LooseBatch.model_validate_json(body)
    except ValidationError as exc:
        raise BatchInvalid(_errors(exc)) from None
    _check_caps(loose)  # before a row is validated on its own
    for where, value in (("run", loose.run.model_dump()), ("devices", [d.model_dump() for d in loose.devices])):
        if _has_nul(value):
            raise BatchInvalid([{"loc": ["body", where], "msg": _NUL_MSG, "type": "value_error"}])
    refused: list[Refused] = []
    kept: dict[str, list[Any]] = {}
    positions: dict[str, list[int]] = {}  # per list: the original index of each kept row
    for series, adapter in _ADAPTERS.items():
        good, at = [], []
        for i, raw in enumerate(getattr(loose, series)):
            if _has_nul(raw):
                refused.append(Refused(series, i, describe(series, raw, i), _NUL_MSG, raw))
                continue
            try:
                good.append(adapter.validate_python(raw))
            except ValidationError as exc:
                refused.append(Refused(series, i, describe(series, raw, i), _first_error(exc), raw))
                continue
            at.append(i)
        kept[series], positions[series] = good, at
    values = {"run": loose.run, "devices": loose.devices, "final": loose.final, **kept}
    batch = IngestBatch.model_construct(**values)
    raws = {series: getattr(loose, series) for series in ROW_TYPES}
    return _cross_checked(batch, positions, refused, now, raws)


def _cross_checked(
    batch: IngestBatch,
    positions: Mapping[str, list[int]],
    refused: list[Refused],
    now: float,
    raws: Mapping[str, list[Any]] | None = None,
) -> CheckedBatch:
    """What spans fields or needs the clock: the run's times (else BatchInvalid), then each row's."""
    max_t = now + FUTURE_SKEW_S
    for name in ("started_at", "ended_at"):
        value = getattr(batch.run, name)
        if value is not None and value > max_t:
            where = ["body", "run", name]
            raise BatchInvalid([{"loc": where, "msg": f"{value} is in the future", "type": "value_error"}])
    bad: dict[str, dict[int, str]] = {
        "gpu_rows": row_problems(batch.gpu_rows, "gpu", now),
        "host_rows": row_problems(batch.host_rows, "host", now),
        "gpu_intervals": row_problems([gpu_tuple(r) for r in batch.gpu_intervals], "gpu", now),
        "host_intervals": row_problems([host_tuple(r) for r in batch.host_intervals], "host", now),
        "events": {i: f"t ({e.t}) is in the future" for i, e in enumerate(batch.events) if e.t > max_t},
        "metrics": {i: f"t ({m.t}) is in the future" for i, m in enumerate(batch.metrics) if m.t > max_t},
    }
    if not any(bad.values()):
        return CheckedBatch(batch, sorted(refused, key=_order))
    changes: dict[str, list[Any]] = {}
    for series, problems in bad.items():
        if not problems:
            continue
        rows = getattr(batch, series)
        for i, reason in problems.items():
            original = positions[series][i] if series in positions else i
            raw = raws[series][original] if raws is not None else _as_json(rows[i])
            refused.append(Refused(series, original, describe(series, raw, original), reason, raw))
        changes[series] = [r for i, r in enumerate(rows) if i not in problems]
    return CheckedBatch(batch.model_copy(update=changes), sorted(refused, key=_order))


def _order(r: Refused) -> tuple[int, int]:
    return list(ROW_TYPES).index(r.series), r.index


def _as_json(row: Any) -> Any:
    return row.model_dump(mode="json") if isinstance(row, BaseModel) else row


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return (f"{where}: " if where else "") + first["msg"] + more


def describe(series: str, raw: Any, index: int) -> str:
    """What a row said it was: "GPU-0 seq 7", "seq 3", or "#index" when it does not say."""
    device, seq = None, None
    if isinstance(raw, Mapping):
        device, seq = raw.get("device_uuid"), raw.get("seq")
    elif isinstance(raw, (list, tuple)):
        if series == "gpu_rows" and len(raw) >= 2:
            device, seq = raw[0], raw[1]
        elif series == "host_rows" and raw:
            seq = raw[0]
    seq_ok = isinstance(seq, int) and not isinstance(seq, bool)
    if series.startswith("gpu") and isinstance(device, str) and seq_ok:
        return f"{device[:256]} seq {seq}"
    if not series.startswith("gpu") and seq_ok:
        return f"seq {seq}"
    return f"#{index}"


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_nul(v) for v in value)
    return False
