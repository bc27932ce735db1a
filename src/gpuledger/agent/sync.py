"""``gpuledger sync``: push every run of the local ledger's outbox to a team server.

Runs recorded with ``--server`` are in the outbox already; ``all_runs`` adds every other local
run (recorded without a server, imported, recovered). A run whose recorder died is settled first
(``lost``, as ``gpuledger show`` would), so the server gets its real end. Rows the server
quarantines (partial acceptance) are reported and recorded, and the run moves on: a bad interval no
longer keeps a run out of the server.

A run waiting in the spool (its end could not be written to the local ledger) is neither settled as
lost nor pushed: its real end is in the spool file, and ``gpuledger recover`` puts it back in the
outbox. A run that fails for a reason of its own (not the server's, not the ledger's) is reported
and kept with its error on its outbox row; the other runs still go.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuledger.agent.capacity_push import push_capacity
from gpuledger.agent.client import Client, Forbidden, Rejected, ServerError
from gpuledger.agent.outbox import FAILED, drain_run
from gpuledger.store import LedgerError, RunNotFound, capacity_push, pushes

if TYPE_CHECKING:
    from gpuledger.store import Ledger


@dataclass
class SyncReport:
    registered: int = 0
    pushed_runs: int = 0
    batches: int = 0
    rows: int = 0
    done: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)
    forbidden: dict[str, str] = field(default_factory=dict)  # kept in the outbox: tried again next time
    missing: list[str] = field(default_factory=list)
    quarantined: dict[str, int] = field(default_factory=dict)  # rows the server refused, per run
    spooled: list[str] = field(default_factory=list)  # waiting for gpuledger recover: not pushed yet
    failed: dict[str, str] = field(default_factory=dict)  # an error of the run's own: kept, tried again next time
    capacity_rows: int = 0  # a node agent's capacity intervals pushed (docs/CAPACITY.md)
    capacity_unsupported: bool = False  # the server is older than the capacity ledger: kept locally


def sync(
    ledger: Ledger,
    client: Client,
    *,
    all_runs: bool = False,
    retry_rejected: bool = False,
    progress: Callable[[str], None] = lambda line: None,
    spooled: Collection[str] | None = None,
) -> SyncReport:
    """Push what the outbox holds for ``client.server``. Unreachable / Unauthorized propagate
    (nothing is lost: the next sync starts where this one stopped), and so do errors of the local
    ledger. ``spooled``: ids of runs waiting in the spool (default: the spool folder's)."""
    from gpuledger.runs.liveness import reconcile

    if spooled is None:
        from gpuledger.recorder.spool import waiting

        spooled = waiting()
    server = client.server
    report = SyncReport()
    # Before any request: should the server stay unreachable, retention still keeps what it lacks.
    capacity_push.register(ledger, server)
    if all_runs:
        report.registered = pushes.register(ledger, server, pushes.unregistered_runs(ledger, server))
    for state in pushes.pending(ledger, server, include_rejected=retry_rejected):
        if state.run_id in spooled:  # its real end is in the spool: not lost, and not known here yet
            report.spooled.append(state.run_id)
            progress(f"{state.run_id}: waits in the spool: write it with gpuledger recover, then sync again")
            continue
        try:
            _push_one(ledger, client, state, report, progress, reconcile)
        except (ServerError, LedgerError):
            raise  # the server or the local ledger: every run would fail the same way
        except Exception as exc:  # this run's own problem: said, kept with the error, the others go on
            why = f"{FAILED}{exc.__class__.__name__}: {exc}"
            report.failed[state.run_id] = why
            progress(f"{state.run_id}: could not be pushed: {why} (kept in the outbox)")
            current = pushes.get(ledger, server, state.run_id) or state
            current.last_error = why
            pushes.save(ledger, current)
    pushed = push_capacity(ledger, client)  # the node's capacity intervals, from the same local ledger
    report.capacity_rows, report.capacity_unsupported = pushed.rows, pushed.unsupported
    if pushed.set_aside:
        first = pushed.set_aside[0]
        progress(f"the server set aside {len(pushed.set_aside)} capacity row(s), e.g. {first.get('item')}: "
                 f"{first.get('reason')}")  # fmt: skip
    return report


def _push_one(
    ledger: Ledger,
    client: Client,
    state: pushes.PushState,
    report: SyncReport,
    progress: Callable[[str], None],
    reconcile: Callable[..., object],
) -> None:
    """Settle one run (a dead recorder's run becomes lost) and push it; its outcome goes in ``report``."""
    try:
        reconcile(ledger, ledger.get_run(state.run_id))
    except RunNotFound:
        state.done, state.last_error = True, "the run is no longer in the local ledger"
        pushes.save(ledger, state)
        report.missing.append(state.run_id)
        return
    try:
        result = drain_run(ledger, client, state)
    except Rejected as exc:
        report.rejected[state.run_id] = str(exc)
        progress(f"{state.run_id}: refused by the server: {exc}")
        return
    except Forbidden as exc:
        report.forbidden[state.run_id] = str(exc)
        progress(f"{state.run_id}: not allowed with this token: {exc}")
        return
    report.batches += result.batches
    report.rows += result.rows
    if result.quarantined:
        report.quarantined[state.run_id] = len(result.quarantined)
        first = result.quarantined[0]
        progress(
            f"{state.run_id}: the server refused {len(result.quarantined)} row(s) and kept the rest "
            f"(first: {first.get('series')} {first.get('item')}: {first.get('reason')})"
        )
    if result.batches:
        report.pushed_runs += 1
    if result.done:
        report.done.append(state.run_id)
        progress(f"{state.run_id}: pushed ({result.rows} rows in {result.batches} batches)")
