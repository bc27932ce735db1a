"""Alert webhook: JSON POSTs from a background thread, retried with backoff, never blocking.

``send(payload)`` only puts the payload on a bounded queue and returns at once; when the queue
is full (the endpoint is down and alerts keep coming) the payload is dropped and counted. The
thread posts with the standard library (urllib), retrying failures after 1, 2, 4, 8 s; a
payload that still fails is reported through ``on_error`` and dropped. ``close(timeout_s)``
gives queued alerts a bounded time to go out at the end of the run.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from gpuledger import __version__

QUEUE_SIZE = 100
TIMEOUT_S = 5.0
BACKOFF_S = (1.0, 2.0, 4.0, 8.0)  # waits between the attempts: five attempts in all
_STOP = object()


class WebhookSender:
    def __init__(
        self,
        url: str,
        on_error: Callable[[str], None] | None = None,
        backoff_s: tuple[float, ...] = BACKOFF_S,
        timeout_s: float = TIMEOUT_S,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self.url = url
        self._on_error = on_error or (lambda message: None)
        self._backoff = backoff_s
        self._timeout = timeout_s
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._closing = threading.Event()
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="gpuledger-webhook", daemon=True)
        self._thread.start()

    def send(self, payload: dict[str, Any]) -> bool:
        """Queue a payload; False (and counted in ``dropped``) when the queue is full or closed."""
        if self._closing.is_set():
            self.dropped += 1
            return False
        try:
            self._queue.put_nowait(payload)
            return True
        except queue.Full:
            self.dropped += 1
            return False

    def close(self, timeout_s: float = 3.0) -> None:
        """Let queued alerts go out for at most ``timeout_s``, then stop (pending retries stop early)."""
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=timeout_s)
        self._thread.join(timeout_s)
        self._closing.set()  # whatever is left is abandoned: the run is over

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            self._deliver(item)

    def _deliver(self, payload: dict[str, Any]) -> None:
        body = json.dumps(payload, default=str).encode()
        error = ""
        for attempt in range(len(self._backoff) + 1):
            if attempt and self._closing.wait(self._backoff[attempt - 1]):
                break
            try:
                request = urllib.request.Request(
                    self.url,
                    data=body,
                    method="POST",
                    headers={"Content-Type": "application/json", "User-Agent": f"gpuledger/{__version__}"},
                )
                with urllib.request.urlopen(request, timeout=self._timeout) as response:
                    response.read()
                self.sent += 1
                return
            except (urllib.error.URLError, OSError, ValueError) as exc:
                error = str(getattr(exc, "reason", exc))
        self.failed += 1
        self._on_error(f"alert webhook {self.url} failed after retries: {error}")
