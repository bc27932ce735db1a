"""Draining the outbox: local rows beyond the watermarks -> batches -> server -> watermarks.

``drain_run`` pushes one run until nothing is left or the server fails; the watermarks move only
after the server acknowledged a batch, so a crash or a lost reply at any point means the batch
is sent again, and the server's idempotent ingest makes that harmless. A run is done once it has
ended, every row is acknowledged, the last batch said ``final`` and its log is stored.

A server that refuses some rows of a batch (partial acceptance) still acknowledges the batch: the
watermarks move on, and what it quarantined is kept in the local ledger (store/quarantine.py) for
``gpuledger sync --status``. A refused row is never sent again; resending it could not change the
answer. The run record is redacted once more before it leaves (metadata from integrations is not
redacted when it is recorded), with the same rules as the server.

A batch is also bounded by its size as sent (``Client.batch_limit_b``, 4 MiB, half the server's
default body limit): a few large events fill a batch as surely as 5,000 intervals. A server (or a
proxy before it) that still answers 413 gets the batch again in smaller pieces, and keeps the lower
limit for the rest of the session; a single row too large for it is kept aside like a row the
server quarantined, so a run is never refused for its size.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuledger.agent.client import BATCH_LIMIT_B, Client, Rejected
from gpuledger.core import push_caps
from gpuledger.core.audit.chain import canonical_json
from gpuledger.core.audit.run_rules import is_final
from gpuledger.core.redaction.redact import Redactor
from gpuledger.core.wire import GPU_COLUMNS, HOST_COLUMNS
from gpuledger.store import RunNotFound, pushes, quarantine

if TYPE_CHECKING:
    from gpuledger.store import Ledger

BATCH_ROWS = 5000  # intervals per push (~2.5 MB of JSON): well under the server's 8 MiB limit
BATCH_BYTES = BATCH_LIMIT_B  # and at most this many bytes per push (4 MiB; Client.batch_limit_b)
FAILED = "failed: "  # last_error prefix of a run whose push failed for a reason of its own (not the server)
FINAL = ("succeeded", "failed", "killed", "lost", "imported")  # and a discovered run once it has an end
MAX_MESSAGE = 65536  # the server's limit for an event message; a longer one is cut, not refused


@dataclass
class DrainResult:
    batches: int = 0
    rows: int = 0
    done: bool = False
    missing: bool = False  # the run is not in the local ledger
    quarantined: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # rows the server refused


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def _redacted(run_doc: dict[str, Any]) -> dict[str, Any]:
    r = Redactor.default()
    return run_doc | {
        "command": r.redact_argv(run_doc["command"]),
        "labels": r.redact_mapping(run_doc["labels"]),
        "meta": r.redact_tree(run_doc["meta"]),
        "git": r.redact_tree(run_doc["git"]),
    }


def _signature(run: dict[str, Any], devices: list[dict[str, Any]]) -> str:
    return hashlib.sha256(canonical_json({"run": run, "devices": devices}).encode()).hexdigest()


def _size(value: Any) -> int:
    """Bytes of ``value`` as Client.ingest sends it (ASCII JSON: one byte per character)."""
    return len(json.dumps(value, separators=(",", ":"), default=str))


SERIES = (("gpu_rows", "gpu_intervals"), ("host_rows", "host_intervals"), ("events", "events"), ("metrics", "metrics"))


def _fit(batch: dict[str, Any], max_bytes: int) -> dict[str, int]:
    """How many rows of each series fit in ``max_bytes`` (the first ones of each: the watermarks
    move over a prefix only); at least one row overall, so every batch moves the outbox on."""
    fixed = _size({k: v for k, v in batch.items() if k not in dict(SERIES)} | {k: [] for k, _ in SERIES})
    total, keep = fixed, {}
    for key, _ in SERIES:
        n = 0
        for item in batch[key]:
            size = _size(item) + 1  # and its comma
            if total + size > max_bytes and (n or any(keep.values())):
                break
            total, n = total + size, n + 1
        keep[key] = n
    return keep


def build_batch(
    ledger: Ledger, state: pushes.PushState, budget: int = BATCH_ROWS, max_bytes: int = BATCH_BYTES
) -> tuple[dict[str, Any], pushes.PushState] | None:
    """The next batch for this run and the state to save once the server acknowledged it; None
    when there is nothing left to send (the log aside). At most ``budget`` intervals (and as many
    events and metrics) and ``max_bytes`` bytes as sent (but never less than one row). The
    budget never exceeds what the server takes in one push (core/push_caps.py)."""
    budget = push_caps.fitting_budget(budget)
    run = ledger.get_run(state.run_id)
    run_doc = _redacted(dataclasses.asdict(run))
    devices = [dataclasses.asdict(d) for d in ledger.devices(run.id)]
    sig = _signature(run_doc, devices)
    rows = pushes.rows_after(ledger, state, budget)
    n = sum(len(v) for v in rows.values())
    ended = is_final(run.status, run.ended_at)
    more = (
        len(rows["gpu_intervals"]) + len(rows["host_intervals"]) >= budget
        or max(len(rows["events"]), len(rows["metrics"])) >= budget
    )
    # log_sig None: the final batch was not acknowledged yet ("pending" once it was).
    if n == 0 and sig == state.run_sig and not (ended and state.log_sig is None):
        return None
    batch: dict[str, Any] = {
        "run": run_doc,
        "gpu_rows": [[r.get(c) for c in GPU_COLUMNS] for r in rows["gpu_intervals"]],
        "host_rows": [[r.get(c) for c in HOST_COLUMNS] for r in rows["host_intervals"]],
        "events": [
            {**e, "message": e["message"][:MAX_MESSAGE], "payload": e.get("payload") or {}} for e in rows["events"]
        ],
        "metrics": [{**m, "value": _jsonable(m["value"])} for m in rows["metrics"]],
        "final": ended,
    }
    if sig != state.run_sig:
        batch["devices"] = devices
    if n and _size(batch) > max_bytes:  # cut to size; the rest goes in the next batches
        keep = _fit(batch, max_bytes)
        for key, source in SERIES:
            if keep[key] < len(batch[key]):
                more = True
                batch[key], rows[source] = batch[key][: keep[key]], rows[source][: keep[key]]
    final = ended and not more
    batch["final"] = final
    after = dataclasses.replace(state, gpu_next=dict(state.gpu_next), run_sig=sig, last_error=None)
    for r in rows["gpu_intervals"]:
        after.gpu_next[r["device_uuid"]] = max(after.gpu_next.get(r["device_uuid"], 0), r["seq"] + 1)
    for key, attr in (("host_intervals", "host_next"), ("events", "event_next"), ("metrics", "metric_next")):
        if rows[key]:
            setattr(after, attr, max(getattr(state, attr), rows[key][-1]["seq"] + 1))
    if final:
        after.log_sig = after.log_sig or "pending"
    return batch, after


def _rows_in(batch: Mapping[str, Any]) -> int:
    return sum(len(batch[k]) for k, _ in SERIES)


def _the_row(batch: Mapping[str, Any]) -> tuple[str, Any]:
    key = next(k for k, _ in SERIES if batch[k])
    return key, batch[key][0]


def _row_is_most(batch: Mapping[str, Any]) -> bool:
    """The one row of ``batch`` is at least half its bytes: the row is too large, not the run
    record sent with it (a record too large for the server refuses the run, as any 4xx does)."""
    return 2 * _size(_the_row(batch)[1]) >= _size(batch)


def _too_large(batch: Mapping[str, Any], exc: Rejected) -> dict[str, Any]:
    """The one row of ``batch``, described as the server describes a row it quarantines."""
    key, row = _the_row(batch)
    seq = row[1] if key == "gpu_rows" else row[0] if key == "host_rows" else row.get("seq")
    item = f"{row[0]} seq {seq}" if key == "gpu_rows" else f"seq {seq}"
    return {
        "series": key,
        "item": item,
        "reason": f"too large for the server alone ({_size(batch):,} bytes as sent; {exc}); not sent again",
    }


def push_log(ledger: Ledger, client: Client, state: pushes.PushState) -> pushes.PushState:
    """Send the run's stored log when it is not on the server yet; the run is then done."""
    info = ledger.log_info(state.run_id)
    after = dataclasses.replace(state)
    if info is not None and info["sha256"] != state.log_sig:
        data = ledger.get_log(state.run_id)
        if data is not None:
            try:
                client.put_log(state.run_id, data, truncated=info["truncated"])
            except Rejected as exc:  # too large for this server: the run is still complete without it
                after.last_error = f"log not stored: {exc}"
        after.log_sig = info["sha256"]
    after.done = True
    return after


def drain_run(
    ledger: Ledger,
    client: Client,
    state: pushes.PushState,
    *,
    budget: int = BATCH_ROWS,
    should_stop: Callable[[], bool] = lambda: False,
) -> DrainResult:
    """Push one run until it is done, nothing is left for now, or an error is raised
    (Unreachable / Unauthorized: retry later; Rejected: recorded on the run, then raised)."""
    out = DrainResult()
    while not should_stop():
        limit_b = getattr(client, "batch_limit_b", BATCH_BYTES)
        try:
            built = build_batch(ledger, state, budget, limit_b)
        except RunNotFound:  # not written locally yet (a run just starting), or deleted since
            out.missing = True
            return out
        if built is None:
            run = ledger.get_run(state.run_id)
            if is_final(run.status, run.ended_at) and state.log_sig is not None and not state.done:
                state = push_log(ledger, client, state)
                pushes.save(ledger, state)
            out.done = state.done
            return out
        batch, after = built
        try:
            answer = client.ingest(batch)
        except Rejected as exc:
            if exc.status == 413 and _rows_in(batch) > 1:  # too large for this server: smaller pieces
                # Halved each time, so at worst down to one row per batch: this always ends.
                client.batch_limit_b = max(1, min(limit_b, _size(batch)) // 2)
                continue
            if exc.status == 413 and _rows_in(batch) == 1 and _row_is_most(batch):  # kept aside, not the run
                aside = _too_large(batch, exc)
                quarantine.record_answer(ledger, client.server, state.run_id, [aside])
                out.quarantined.append(aside)
                # The row is passed over; the run record and its end still have to be acknowledged.
                state = dataclasses.replace(after, run_sig=state.run_sig, log_sig=state.log_sig)
                pushes.save(ledger, state)
                continue
            state.last_error = pushes.REJECTED + str(exc)
            pushes.save(ledger, state)
            raise
        refused = (answer.get("quarantined") if isinstance(answer, dict) else None) or []
        if refused:  # kept before the watermarks move: a crash in between only records it twice
            quarantine.record_answer(ledger, client.server, state.run_id, refused)
            out.quarantined += refused
        pushes.save(ledger, after)
        state = after
        out.batches += 1
        out.rows += sum(len(batch[k]) for k in ("gpu_rows", "host_rows", "events", "metrics"))
    return out
