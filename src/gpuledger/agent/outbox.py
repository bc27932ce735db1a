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
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuledger.agent.client import Client, Rejected
from gpuledger.core.audit.chain import canonical_json
from gpuledger.core.audit.run_rules import is_final
from gpuledger.core.redaction.redact import Redactor
from gpuledger.core.wire import GPU_COLUMNS, HOST_COLUMNS
from gpuledger.store import RunNotFound, pushes, quarantine

if TYPE_CHECKING:
    from gpuledger.store import Ledger

BATCH_ROWS = 5000  # intervals per push (~2.5 MB of JSON): well under the server's 8 MiB limit
FINAL = ("succeeded", "failed", "killed", "lost", "imported")  # and a discovered run once it has an end
FAILED = "failed: "  # last_error prefix of a run whose push failed for a reason of its own (not the server)
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


def build_batch(
    ledger: Ledger, state: pushes.PushState, budget: int = BATCH_ROWS
) -> tuple[dict[str, Any], pushes.PushState] | None:
    """The next batch for this run and the state to save once the server acknowledged it; None
    when there is nothing left to send (the log aside)."""
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
    final = ended and not more
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
        "final": final,
    }
    if sig != state.run_sig:
        batch["devices"] = devices
    after = dataclasses.replace(state, gpu_next=dict(state.gpu_next), run_sig=sig, last_error=None)
    for r in rows["gpu_intervals"]:
        after.gpu_next[r["device_uuid"]] = max(after.gpu_next.get(r["device_uuid"], 0), r["seq"] + 1)
    for key, attr in (("host_intervals", "host_next"), ("events", "event_next"), ("metrics", "metric_next")):
        if rows[key]:
            setattr(after, attr, max(getattr(state, attr), rows[key][-1]["seq"] + 1))
    if final:
        after.log_sig = after.log_sig or "pending"
    return batch, after


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
        try:
            built = build_batch(ledger, state, budget)
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
