"""``gpuledger agent --server``: discovered runs go through the same outbox as wrapped runs.

Each run the agent writes is registered in the local ledger's outbox (store/pushes.py) and pushed by
``agent/sync.sync`` — the code ``gpuledger sync`` runs — from one daemon thread, woken after each
write and at least every ``PERIOD_S``. A server that is down, slow or refusing costs a retry with
the backoff of ``agent/pusher.backoff_s``, said once on stderr and once when it is back; the
outbox is in the ledger, so nothing is lost across an agent restart either.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from gpuledger.agent.client import Unreachable
from gpuledger.agent.pusher import backoff_s

PERIOD_S = 10.0


class NodePusher:
    def __init__(
        self,
        ledger_url: str | None,
        server: str,
        token: str | None,
        *,
        warn: Callable[[str], None],
        period_s: float = PERIOD_S,
        client: Any = None,
        backoff_min_s: float = 1.0,
    ) -> None:
        self.server = server
        self._url = ledger_url
        self._token = token
        self._warn = warn
        self._period_s = period_s
        self._client = client
        self._backoff_min_s = backoff_min_s
        self._ledger: Any = None
        self._new: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._failures = 0
        self._next_try = 0.0
        self._said_down = False
        self._told: set[str] = set()  # runs whose refusal was said already
        self.last_error: str | None = None
        self.pushed_at: float | None = None
        self._thread = threading.Thread(target=self._loop, name="gpuledger-agent-pusher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wrote(self, run_ids: Iterable[str]) -> None:
        """The ledger thread wrote these runs: register them (once) and push soon."""
        with self._lock:
            self._new.update(run_ids)
        self._wake.set()

    def close(self, timeout_s: float = 5.0) -> None:
        self._next_try = 0.0  # one last try right away
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        if not self._thread.is_alive() and self._ledger is not None:
            self._ledger.close()

    def _loop(self) -> None:
        while True:
            stopping = self._stop.is_set()
            if time.monotonic() >= self._next_try:
                self.push_once()
            if stopping:
                return
            self._wake.wait(self._period_s)
            self._wake.clear()

    def push_once(self) -> None:
        from gpuledger.agent.client import Client
        from gpuledger.agent.sync import sync
        from gpuledger.store import Ledger, pushes

        try:
            if self._ledger is None:
                self._ledger = Ledger(self._url)
            with self._lock:
                new, self._new = self._new, set()
            try:
                if new:
                    pushes.register(self._ledger, self.server, sorted(new))
            except Exception:
                with self._lock:
                    self._new |= new
                raise
            if self._client is None:
                self._client = Client(self.server, self._token, timeout_s=30.0)
            report = sync(self._ledger, self._client)
        except Exception as exc:  # the agent must never stop for a server
            self._failures += 1
            self.last_error = str(exc)
            wait = backoff_s(self._failures, min_s=self._backoff_min_s)
            if isinstance(exc, Unreachable) and exc.retry_after_s is not None:
                wait = max(wait, exc.retry_after_s)
            self._next_try = time.monotonic() + wait
            if not self._said_down:
                self._said_down = True
                self._warn(f"gpuledger agent: cannot push to {self.server} ({exc}); runs stay in the local "
                           "ledger's outbox and are pushed when it is back")  # fmt: skip
            return
        for run_id, why in {**report.rejected, **report.forbidden}.items():
            if run_id not in self._told:
                self._told.add(run_id)
                self._warn(f"gpuledger agent: the server {self.server} refused run {run_id}: {why}")
        if self._said_down:
            self._said_down = False
            self._warn(f"gpuledger agent: pushing to {self.server} again")
        self._failures, self._next_try = 0, 0.0
        self.pushed_at = time.time()
