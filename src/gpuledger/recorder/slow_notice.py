"""A line on stderr when the end of a run keeps the user waiting.

CMD has ended; gpuledger still takes the final reading and writes the run. Against a ledger
another process holds (a long ``gpuledger report``, a backup copying the SQLite file, a locked
PostgreSQL row), those writes wait up to the busy timeout before the run is spooled, and the
terminal would sit silent all that time. The blocks a notice times share one allowance: the line
is said once, when together they have taken ``after_s``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

WRITE_NOTICE_S = 5.0


class SlowNotice:
    def __init__(self, line: str, say: Callable[[str], None], after_s: float = WRITE_NOTICE_S) -> None:
        self._line, self._say, self._left = line, say, after_s
        self._said = threading.Event()
        self.enabled = True

    def _fire(self) -> None:
        if not self._said.is_set():
            self._said.set()
            self._say(self._line)

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        if not self.enabled or self._said.is_set():
            yield
            return
        timer = threading.Timer(self._left, self._fire)
        timer.daemon = True
        started = time.monotonic()
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            self._left = max(0.0, self._left - (time.monotonic() - started))
