"""Which text of a run the ledger keeps, redacted: one list for the agent and the server.

The recorder (recorder/session.py, recorder/recorder.py) redacts these fields before they reach
the local ledger, and the team server (server/redaction.py) redacts them again in every push, with
the same rules (redact_rules.toml): a secret typed into a run name, a directory, a label key, a git
branch, a metric name or an event kind is stored nowhere. Identity fields (user, host, cwd,
command, git, versions) stay stable between pushes of a run because redaction is deterministic
and redacting twice changes nothing.

Everything that is text is redacted, except the fields listed in ``RUN_IDENTIFIERS`` (checked
patterns or fixed words, no free text), so a field added to the run record later is redacted
without anyone remembering to.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuledger.core.redaction.redact import Redactor

__all__ = ["RUN_IDENTIFIERS", "TextCache", "redact_run_fields"]

# Run fields that are not free text: a run id (checked pattern), a status (a fixed word).
RUN_IDENTIFIERS = frozenset({"id", "attempt_of", "status"})


def redact_run_fields(r: Redactor, fields: Mapping[str, Any], keep: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Every text field of a run record (``fields``: its columns by name) redacted; the fields
    that are not text, the identifiers and those in ``keep`` are returned as they are."""
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if key in RUN_IDENTIFIERS or key in keep or value is None:
            out[key] = value
        elif key == "command" and isinstance(value, list):
            out[key] = r.redact_argv(value)
        elif key == "labels" and isinstance(value, Mapping):
            out[key] = r.redact_mapping(value)
        elif isinstance(value, (str, Mapping, list, tuple)):
            out[key] = r.redact_tree(value)
        else:
            out[key] = value
    return out


class TextCache:
    """``redact_text`` remembered per distinct value: the few names that repeat in thousands of
    rows (metric keys, device ids, method names) are redacted once per batch."""

    MAX_SEEN = 4096  # a sender inventing new names forever only makes it forget

    def __init__(self, r: Redactor) -> None:
        self.redactor = r
        self._seen: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        try:
            return self._seen[text]
        except KeyError:
            if len(self._seen) >= self.MAX_SEEN:
                self._seen.clear()
            out = self._seen[text] = self.redactor.redact_text(text)
            return out

    def changes(self, values: set[Any]) -> dict[str, str]:
        """Of ``values``, the strings that redaction changes, with what they become."""
        return {v: red for v in values if isinstance(v, str) and (red := self(v)) != v}
