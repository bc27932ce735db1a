"""Server-side redaction: what an agent pushes is redacted again before it is stored.

The agent redacts when it records (recorder/session.py, the log relay), but the server cannot
trust that: an old agent, a run recorded before a rule existed, a hand-written push or an
integration's metadata may still carry a secret. The server applies the same rules (one rule set,
core/redaction/redact_rules.toml, through core/redaction/redact.py) to every text it stores: each
text field of the run record (core/redaction/records.py: name, command, user, host, cwd, labels
and their keys, git, versions, metadata, status reason ...), the devices' text (names, ids,
versions), the GPU rows' text columns (device id, method names, throttle reasons), event kinds,
messages and payloads, metric keys, and the quarantined rows with what they said they were and
why they were refused; logs are redacted as they stream in (log_upload.py). Redaction is
deterministic and redacting twice changes nothing, so a run's identity fields compare equal from
push to push, and an already redacted push is stored as is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuledger.core.redaction.records import TextCache, redact_run_fields
from gpuledger.core.redaction.redact import Redactor
from gpuledger.core.wire import GPU_COLUMNS
from gpuledger.server.models import IngestBatch

# Text columns of a compact GPU row (the others are numbers), and its throttle reasons (a mapping).
_GPU_TEXT = tuple(GPU_COLUMNS.index(c) for c in ("device_uuid", "util_method", "energy_method", "proc_method"))
_GPU_THROTTLE = GPU_COLUMNS.index("throttle_s")


def redactor() -> Redactor:
    return Redactor.default()


def redact_batch(batch: IngestBatch) -> IngestBatch:
    r = redactor()
    text = TextCache(r)
    run = batch.run
    fields = {name: getattr(run, name) for name in type(run).model_fields}
    run = run.model_copy(update=redact_run_fields(r, fields))
    devices = [d.model_copy(update=_text_fields(d, text)) for d in batch.devices]
    events = [
        e.model_copy(
            update={"kind": text(e.kind), "message": r.redact_text(e.message), "payload": r.redact_tree(e.payload)}
        )
        for e in batch.events
    ]
    metric_keys = text.changes({m.key for m in batch.metrics})
    metrics = [m.model_copy(update={"key": metric_keys[m.key]}) if m.key in metric_keys else m for m in batch.metrics]
    update = {
        "run": run,
        "devices": devices,
        "events": events,
        "metrics": metrics,
        "gpu_rows": _gpu_rows(batch.gpu_rows, text),
        "gpu_intervals": [_gpu_interval(i, text) for i in batch.gpu_intervals],
    }
    return batch.model_copy(update=update)


def redact_refused(refused: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows refused one by one, as the quarantine keeps them: the row as sent (keys too), what it
    said it was (a device id) and why it was refused (a message may quote a key), redacted. The row
    is redacted before the quarantine takes its sha256: a hash of a row holding a short password
    is a way to check guesses at it."""
    text = TextCache(redactor())
    return [
        {
            **row,
            "item": text(str(row["item"])),
            "reason": text(str(row["reason"])),
            "raw": text.redactor.redact_tree(row["raw"]),
        }
        for row in refused
    ]


def _text_fields(model: Any, text: TextCache) -> dict[str, str]:
    return {k: text(v) for k, v in model.__dict__.items() if isinstance(v, str) and text(v) != v}


def _gpu_rows(rows: Sequence[tuple[Any, ...]], text: TextCache) -> list[tuple[Any, ...]]:
    """Compact GPU rows with their text redacted: the distinct values of each text column are
    redacted once, and rows are rebuilt only when one of them changed (almost never)."""
    if not rows:
        return list(rows)
    changed = {j: text.changes({row[j] for row in rows}) for j in _GPU_TEXT}
    throttle = text.changes({k for row in rows if row[_GPU_THROTTLE] for k in row[_GPU_THROTTLE]})
    if not throttle and not any(changed.values()):
        return list(rows)
    out = []
    for row in rows:
        cells = list(row)
        for j, new in changed.items():
            if cells[j] in new:
                cells[j] = new[cells[j]]
        if throttle and cells[_GPU_THROTTLE]:
            cells[_GPU_THROTTLE] = {throttle.get(k, k): v for k, v in cells[_GPU_THROTTLE].items()}
        out.append(tuple(cells))
    return out


def _gpu_interval(row: Mapping[str, Any], text: TextCache) -> dict[str, Any]:
    out = {k: text(v) if isinstance(v, str) else v for k, v in row.items()}
    if isinstance(out.get("throttle_s"), Mapping):
        out["throttle_s"] = {text(k): v for k, v in out["throttle_s"].items()}
    return out
