"""Records <-> rows. Columns carry the dataclass field names, so the mapping is by name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar

from gpuledger.core.model import (
    RUN_STATUSES,
    Event,
    GpuIdentity,
    GpuInterval,
    HostInterval,
    Metric,
    RunRecord,
)

R = TypeVar("R")

RUN_FIELDS = frozenset(f.name for f in fields(RunRecord))
# Everything but the id can be changed after creation.
UPDATABLE_RUN_FIELDS = RUN_FIELDS - {"id"}
_JSON_DICT_FIELDS = ("labels", "git", "versions", "meta")


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}  # per record class: fields() is not free, rows are many


def to_row(record: Any, **extra: Any) -> dict[str, Any]:
    names = _FIELD_NAMES.get(type(record))
    if names is None:
        names = _FIELD_NAMES[type(record)] = tuple(f.name for f in fields(record))
    row = {name: getattr(record, name) for name in names}
    row.update(extra)
    return row


def from_row(cls: type[R], row: Mapping[str, Any]) -> R:
    return cls(**{f.name: row[f.name] for f in fields(cls)})  # type: ignore[arg-type]


def check_status(status: str) -> None:
    if status not in RUN_STATUSES:
        raise ValueError(f"unknown run status {status!r}; use one of {', '.join(RUN_STATUSES)}")


def label_columns(labels: Mapping[str, Any]) -> dict[str, Any]:
    """The denormalised columns kept in step with ``labels``."""
    project, team = labels.get("project"), labels.get("team")
    return {
        "project": None if project is None else str(project),
        "team": None if team is None else str(team),
    }


def label_rows(run_id: str, labels: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"run_id": run_id, "key": str(k), "value": str(v)} for k, v in labels.items()]


def run_row(run: RunRecord) -> dict[str, Any]:
    check_status(run.status)
    row = to_row(run)
    row["command"] = list(run.command)
    for name in _JSON_DICT_FIELDS:
        row[name] = dict(row[name] or {})
    row.update(label_columns(row["labels"]))
    return row


def run_update_values(changes: Mapping[str, Any]) -> dict[str, Any]:
    """Column values for ``update_run(**changes)``; ValueError on a field RunRecord does not have."""
    unknown = sorted(set(changes) - UPDATABLE_RUN_FIELDS)
    if unknown:
        raise ValueError(
            f"cannot update run field(s) {', '.join(unknown)}; updatable: {', '.join(sorted(UPDATABLE_RUN_FIELDS))}"
        )
    values = dict(changes)
    if "status" in values:
        check_status(values["status"])
    for name in _JSON_DICT_FIELDS:
        if name in values:
            values[name] = dict(values[name] or {})
    if "command" in values:
        values["command"] = list(values["command"])
    if "labels" in values:
        values.update(label_columns(values["labels"]))
    return values


def run_from_row(row: Mapping[str, Any]) -> RunRecord:
    run = from_row(RunRecord, row)
    for name in _JSON_DICT_FIELDS:  # never None, even for a row written by hand
        if getattr(run, name) is None:
            setattr(run, name, {})
    run.replayed = bool(run.replayed)
    return run


def device_from_row(row: Mapping[str, Any]) -> GpuIdentity:
    return from_row(GpuIdentity, row)


def gpu_from_row(row: Mapping[str, Any]) -> GpuInterval:
    return from_row(GpuInterval, row)


def host_from_row(row: Mapping[str, Any]) -> HostInterval:
    return from_row(HostInterval, row)


def event_from_row(row: Mapping[str, Any]) -> Event:
    return from_row(Event, row)


def metric_from_row(row: Mapping[str, Any]) -> Metric:
    return from_row(Metric, row)
