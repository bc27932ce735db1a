"""What a push may change of a run already stored (pure): the rules that keep history immutable.

- **Identity is frozen at creation**: the user, host, command, working directory, start time,
  the recorder's settings and the code and driver versions never change, nor does any stored
  device (its UUID, name, memory, MIG profile ...).
- **A finished run's record is final** (a ``discovered`` run has finished once its agent set its
  end): its status, end, exit code, labels and the rest cannot change, with one exception:
  ``lost`` is a verdict drawn from silence (the recorder died, or the server heard nothing for too
  long), so the run's owner may still report how it really ended, and only that: its status (once,
  from ``lost`` to another final status), exit code, signal and status reason, and an end no
  earlier than its last recorded interval and at most ``LOST_SLACK_S`` after it. Its labels, name
  and the rest stay as they were; while it stays ``lost`` its end cannot move.
- **While a run records**, its other fields (labels, metadata, name, status ...) may change; each
  change is audited with the old and the new values.
- **Rows must lie inside the run's span**: no interval, event or metric from before its start or,
  once it has ended, after its end; a ``lost`` run's late rows may reach ``LOST_SLACK_S`` past the
  end the verdict gave it (its last sign of life), no further.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuledger.core.model import DISCOVERED, run_is_open

FINAL = frozenset({"succeeded", "failed", "killed", "lost", "imported"})
IDENTITY_FIELDS = (
    "user", "host", "command", "cwd", "started_at", "replayed", "interval_s", "git", "versions", "recorder_pid",
    "log_path",
)  # fmt: skip
# Columns a run row holds that are not the agent's to send (derived, or written by the server).
NOT_SENT = frozenset({"id", "rolled_up"})
SPAN_SLACK_S = 5.0  # clock granularity between a run's own timestamps
# How far past its last sign of life a lost run may still have rows, and past its last interval its
# owner may put its real end: an agent flushes every few seconds and retries every minute, so an hour
# covers a recorder that died between two flushes and an agent cut off until the sweep (an hour).
LOST_SLACK_S = 3600.0
# What the owner of a lost run may still report: how it ended, nothing else.
LOST_MAY_CHANGE = frozenset({"status", "ended_at", "exit_code", "signal", "status_reason"})


def is_final(status: str | None, ended_at: float | None) -> bool:
    """The run has finished: a FINAL status, or a discovered run with an end."""
    return status in FINAL or (status == DISCOVERED and ended_at is not None)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return bool(a == b)


@dataclass(frozen=True)
class RecordVerdict:
    changes: dict[str, Any]  # column -> new value, to apply
    old: dict[str, Any]  # column -> value before, for the audit row
    refusal: str | None = None  # why the push is refused as a whole
    stale: bool = False  # a late copy of the record from before the run ended: ignored
    ended_now: bool = False  # this push ends the run


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def judge_record(
    run_id: str,
    stored: Mapping[str, Any],
    sent: Mapping[str, Any],
    last_row_t1: float | None = None,
    last_seen: float | None = None,
) -> RecordVerdict:
    """What of the ``sent`` run row may be applied to the ``stored`` one. ``last_row_t1``: the end of
    the run's last interval (stored, or taken in this push); ``last_seen``: for a run the sweep
    marked lost, its last sign of life as the server noted it. They bound a lost run's real end."""
    frozen = [k for k in IDENTITY_FIELDS if k in sent and not same(stored.get(k), sent[k])]
    if frozen:
        shown = "; ".join(f"{k} stored {_show(stored.get(k))}, sent {_show(sent[k])}" for k in frozen)
        return RecordVerdict(
            {}, {}, f"run {run_id}: {', '.join(frozen)} cannot change after the run was created ({shown})"
        )
    diff = {k: v for k, v in sent.items() if k not in NOT_SENT and not same(stored.get(k), v)}
    old = {k: stored.get(k) for k in diff}
    was = stored.get("status")
    if is_final(was, stored.get("ended_at")):
        if run_is_open(sent.get("status"), sent.get("ended_at")):
            return RecordVerdict({}, {}, stale=True)  # an older copy of the record: never reopens a run
        if diff and was == "lost":
            refusal = lost_refusal(run_id, stored, diff, last_row_t1, last_seen)
            if refusal:
                return RecordVerdict({}, {}, refusal)
        elif diff:
            return RecordVerdict(
                {},
                {},
                f"run {run_id} has ended ({was}): its record is final and cannot change ({', '.join(sorted(diff))})",
            )
    after = {**stored, **diff}
    return RecordVerdict(diff, old, ended_now=bool(diff) and is_final(after.get("status"), after.get("ended_at")))


def lost_refusal(
    run_id: str,
    stored: Mapping[str, Any],
    diff: Mapping[str, Any],
    last_row_t1: float | None,
    last_seen: float | None = None,
) -> str | None:
    """Why a change to a lost run is not how it ended (None: it may be applied). Its end lies
    between its last interval (its start without one) and ``LOST_SLACK_S`` after the later of that
    and ``last_seen`` (without either: after the end the verdict gave it)."""
    other = sorted(set(diff) - LOST_MAY_CHANGE)
    if other:
        return (
            f"run {run_id} is lost: its owner may report only how it ended (status, end, exit code, signal, "
            f"reason), not {', '.join(other)}"
        )
    status = diff.get("status", stored.get("status"))
    if status not in FINAL:
        return f"run {run_id} is lost: it can only end as {', '.join(sorted(FINAL - {'lost'}))}, not {status!r}"
    if "ended_at" not in diff:
        return None
    if status == "lost":
        return f"run {run_id} is lost: its end moves only with the report of how it ended (status), not alone"
    end = diff["ended_at"]
    if end is None:
        return f"run {run_id} is lost: its end cannot be removed"
    floor = float(last_row_t1 if last_row_t1 is not None else stored["started_at"])
    known = [t for t in (last_row_t1, last_seen) if t is not None]
    ceiling = max(known) if known else float(stored.get("ended_at") or floor)
    if end < floor - SPAN_SLACK_S or end > ceiling + LOST_SLACK_S:
        return (
            f"run {run_id} is lost: its end may lie between its last interval ({floor:.0f}) and "
            f"{LOST_SLACK_S:g} s after its last sign of life ({ceiling:.0f}), not at {float(end):.0f}"
        )
    return None


def device_refusal(run_id: str, stored: Mapping[str, Any], sent: Mapping[str, Any]) -> str | None:
    """Why a device sent again for a run differs from the one stored (None: the same)."""
    changed = sorted(k for k, v in sent.items() if k in stored and not same(stored[k], v))
    if not changed:
        return None
    return f"run {run_id}: GPU {sent.get('uuid')} cannot change after it was reported ({', '.join(changed)})"


@dataclass(frozen=True)
class Span:
    """The times a run's rows may have: [start - slack, end + slack] (no end while it records)."""

    start: float
    end: float | None
    closed: float | None = None  # months before this instant are billed and closed (store/closed_months.py)

    @classmethod
    def of(cls, run: Mapping[str, Any]) -> Span:
        start = float(run["started_at"])
        if run.get("status") == "lost":  # it may have run on a while: its owner's late rows are taken, for a time
            return cls(start, float(run.get("ended_at") or start) + LOST_SLACK_S - SPAN_SLACK_S)
        ended = is_final(run.get("status"), run.get("ended_at"))
        return cls(start, float(run["ended_at"]) if ended else None)

    def refusal(self, t0: float, t1: float) -> str | None:
        if t0 < self.start - SPAN_SLACK_S:
            return f"starts at {t0}, before the run started ({self.start})"
        if self.closed is not None and t0 < self.closed:
            return f"dated {t0}, in a closed month (before {self.closed}): its bill is final"
        if self.end is not None and t1 > self.end + SPAN_SLACK_S:
            return f"ends at {t1}, after the run ended ({self.end})"
        return None
