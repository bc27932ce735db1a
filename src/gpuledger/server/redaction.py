"""Server-side redaction: what an agent pushes is redacted again before it is stored.

The agent redacts when it records (recorder/session.py, the log relay), but the server cannot
trust that: an old agent, a run recorded before a rule existed, a hand-written push or an
integration's metadata may still carry a secret. The server applies the same rules (one rule set,
core/redaction/redact_rules.toml, through core/redaction/redact.py) to the command line, labels, metadata, git state,
run name and status reason, and to event messages and payloads; logs are redacted as they stream
in (routes_write.py). Redacting twice changes nothing, so an already redacted push is stored as is.
"""

from __future__ import annotations

from gpuledger.core.redaction.redact import Redactor
from gpuledger.server.models import IngestBatch


def redactor() -> Redactor:
    return Redactor.default()


def redact_batch(batch: IngestBatch) -> IngestBatch:
    r = redactor()
    run = batch.run
    changes = {
        "command": r.redact_argv(run.command),
        "labels": r.redact_mapping(run.labels),
        "meta": r.redact_tree(run.meta),
        "git": r.redact_tree(run.git),
        "name": None if run.name is None else r.redact_text(run.name),
        "status_reason": None if run.status_reason is None else r.redact_text(run.status_reason),
    }
    events = [
        e.model_copy(update={"message": r.redact_text(e.message), "payload": r.redact_tree(e.payload)})
        for e in batch.events
    ]
    return batch.model_copy(update={"run": run.model_copy(update=changes), "events": events})
