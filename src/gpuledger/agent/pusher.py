"""The background pusher of ``gpuledger run --server``: drains the outbox while the run records.

It runs in a daemon thread of the gpuledger process (never inside the training), wakes after each
flush to the local ledger (``wake``) or every ``PERIOD_S``, and pushes what the local ledger holds
beyond the watermarks. A server that is down, slow or failing costs nothing but a retry later:
backoff doubles from 1 s to 60 s with jitter, the problem is said once on stderr, and the recovery
once. ``close`` gives the last batches a bounded time; whatever is left is pushed by
``gpuledger sync``.

Only the server and the local ledger fail in ways worth waiting out. Any other error (the run's own
data that cannot be sent, a bug) is not retried as if the server were down: it is said once and
kept on the run's outbox row (``gpuledger sync --status``), and ``gpuledger sync`` tries the run
again, alone, without holding up the others.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable

import sqlalchemy as sa

from gpuledger.agent.client import Client, Forbidden, Rejected, ServerError, Unauthorized, Unreachable
from gpuledger.agent.outbox import BATCH_ROWS, FAILED, drain_run
from gpuledger.store import LedgerError, pushes

PERIOD_S = 10.0
BACKOFF_MIN_S = 1.0
BACKOFF_MAX_S = 60.0


def backoff_s(
    failures: int, rand: Callable[[], float] = random.random, min_s: float = BACKOFF_MIN_S, max_s: float = BACKOFF_MAX_S
) -> float:
    """Seconds to wait after ``failures`` failures in a row: doubling, capped, +-50 % jitter."""
    base = min(max_s, min_s * 2 ** max(0, min(failures, 32) - 1))
    return base * (0.5 + rand())


# Worth retrying later: the server (down, 5xx, a proxy's page that is not JSON) or the local ledger
# (locked, an error SQLAlchemy passed through untranslated). Anything else is the run's own.
_PASSING: tuple[type[BaseException], ...] = (ServerError, LedgerError, sa.exc.DBAPIError, json.JSONDecodeError)


class Pusher:
    def __init__(
        self,
        ledger_url: str | None,
        server: str,
        token: str | None,
        run_id: str,
        *,
        warn: Callable[[str], None],
        period_s: float = PERIOD_S,
        budget: int = BATCH_ROWS,
        client: Client | None = None,
        backoff_min_s: float = BACKOFF_MIN_S,
    ) -> None:
        self.server = server
        self.run_id = run_id
        self._url = ledger_url
        self._token = token
        self._warn = warn
        self._period_s = period_s
        self._budget = budget
        self._client = client
        self._backoff_min_s = backoff_min_s
        self._ledger = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._failures = 0
        self._next_try = 0.0
        self._said_down = False
        self.done = False
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._loop, name="gpuledger-pusher", daemon=True)
        # Should the run end up in the spool (the ledger locked, perhaps before the outbox ever
        # knew the run), its spool file names this server, and recover puts it in its outbox.
        from gpuledger.recorder.spool import push_to

        push_to(run_id, server)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """New rows are in the local ledger (called after each flush)."""
        self._wake.set()

    def close(self, timeout_s: float = 5.0) -> bool:
        """Stop after one last attempt within ``timeout_s``; True when the run is fully pushed."""
        if self._next_try != float("inf"):  # given up on (refused, or its own error): said once
            self._next_try = 0.0  # the end of a run is worth one more try right away
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        if self._ledger is not None and not self._thread.is_alive():
            self._ledger.close()
        return self.done

    def _open(self) -> tuple[object, Client]:
        if self._ledger is None:
            from gpuledger.store import Ledger

            self._ledger = Ledger(self._url)
            pushes.register(self._ledger, self.server, [self.run_id])
        if self._client is None:
            self._client = Client(self.server, self._token, timeout_s=30.0)
        return self._ledger, self._client

    def _loop(self) -> None:
        while True:
            stopping = self._stop.is_set()
            if time.monotonic() >= self._next_try:
                self.push_once(stopping)
            if stopping or self.done:
                return
            self._wake.wait(self._period_s)
            self._wake.clear()

    def push_once(self, stopping: bool = False) -> None:
        try:
            ledger, client = self._open()
            state = pushes.get(ledger, self.server, self.run_id)  # type: ignore[arg-type]
            if state is None or state.done:
                self.done = state is not None
                return
            result = drain_run(
                ledger,  # type: ignore[arg-type]
                client,
                state,
                budget=self._budget,
                should_stop=lambda: self._stop.is_set() and not stopping,
            )
            self.done = result.done
            if result.quarantined:
                first = result.quarantined[0]
                self._warn(
                    f"gpuledger: the server {self.server} refused {len(result.quarantined)} row(s) of run "
                    f"{self.run_id} and kept the rest (first: {first.get('series')} {first.get('item')}: "
                    f"{first.get('reason')}); see gpuledger sync --status"
                )
        except Rejected as exc:
            self.last_error = str(exc)
            self._warn(f"gpuledger: the server {self.server} refused run {self.run_id}: {exc}; see gpuledger sync")
            self._next_try = float("inf")
            return
        except Exception as exc:  # the training must never notice
            if not isinstance(exc, _PASSING):
                self._failed(exc)
                return
            self._failures += 1
            self.last_error = str(exc)
            wait = backoff_s(self._failures, min_s=self._backoff_min_s)
            if isinstance(exc, Unreachable) and exc.retry_after_s is not None:
                wait = max(wait, exc.retry_after_s)  # the server said when (429 Retry-After)
            self._next_try = time.monotonic() + wait
            if not self._said_down:
                self._said_down = True
                # A refused token is not a server that is away: say what will make the push go through.
                when = "the token is accepted" if isinstance(exc, (Unauthorized, Forbidden)) else "the server is back"
                self._warn(
                    f"gpuledger: cannot push to {self.server} ({exc}); the run is kept in the local ledger "
                    f"and pushed when {when} (or later with: gpuledger sync)"
                )
            return
        if self._said_down:
            self._warn(f"gpuledger: pushing to {self.server} again")
            self._said_down = False
        self._failures = 0
        self._next_try = 0.0

    def _failed(self, exc: Exception) -> None:
        """Not the server, not the ledger: retrying would fail the same way. Said once, kept on the
        run's outbox row, and left to ``gpuledger sync``."""
        self.last_error = f"{FAILED}{exc.__class__.__name__}: {exc}"
        self._next_try = float("inf")
        try:
            ledger, _ = self._open()
            state = pushes.get(ledger, self.server, self.run_id)  # type: ignore[arg-type]
            if state is not None:
                state.last_error = self.last_error
                pushes.save(ledger, state)  # type: ignore[arg-type]
        except Exception:  # the ledger itself: the warning below is all that can be done
            pass
        self._warn(
            f"gpuledger: cannot push run {self.run_id} to {self.server}: {self.last_error}; the run is kept in "
            "the local ledger's outbox (see gpuledger sync --status)"
        )
