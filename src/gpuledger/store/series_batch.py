"""Group commit of live pushes into one store insert (docs/SCALE.md, section 5; issue 38 item 5).

On ClickHouse an insert costs per insert, not per row (three parts: raw rows, per-GPU day and
run × day rollups), so concurrent pushes' new rows are gathered and written by ONE flush: the
first push of a batch leads it and flushes once ``rows`` rows wait, ``wait_s`` has passed since
it came, or no other push is on its way (a lone agent does not wait). Every member waits for the
flush that carries its rows and gets its result: a push is acknowledged only once its rows are
stored; a failed flush fails every member (each gets its own exception from ``failed``).

"On its way": a push that entered ``pushing()`` (store/ingest.py enters it once it holds its
run's lock) and has not written yet. Pushes waiting for a database connection or another push's
run lock are not counted, so they never hold a batch back; one that is counted and writes nothing
(a resend the ledger already holds) leaves ``pushing()`` and the leader looks again.

One flush at a time: while one runs the next batch keeps gathering, whatever its size.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Row = Mapping[str, Any]


@dataclass
class Push:
    """One push's new rows (ledger rows without run_id) and, once flushed, its result."""

    run_id: str
    gpu: Sequence[Row]
    host: Sequence[Row]
    stored: int = 0
    error: BaseException | None = None


@dataclass
class _Batch:
    started: float
    pushes: list[Push] = field(default_factory=list)
    rows: int = 0
    done: bool = False


Flush = Callable[[list[Push]], list[int]]  # the rows stored per push, in order; raises to fail them all


class GroupCommit:
    """Concurrent ``submit`` calls gathered into batches, each written by one ``flush``."""

    def __init__(
        self,
        flush: Flush,
        *,
        rows: int,
        wait_s: float,
        failed: Callable[[BaseException], BaseException],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``rows`` > 0: flush once that many rows wait; ``wait_s`` >= 0: or once the batch's first
        push has waited that long (0: as soon as no flush runs). ``failed(exc)``: the exception
        each member of a failed flush raises."""
        if rows < 1:
            raise ValueError(f"a batch needs at least 1 row to flush at, not {rows}")
        if not wait_s >= 0:
            raise ValueError(f"the longest wait of a batch is 0 or more seconds, not {wait_s}")
        self.rows, self.wait_s = rows, wait_s
        self._flush, self._failed, self._clock = flush, failed, clock
        self._cv = threading.Condition()
        self._open: _Batch | None = None
        self._flushing = False
        self._coming = 0  # pushes in pushing() that have not submitted yet
        self._mine = threading.local()
        self.flushes = 0  # batches written (for benchmarks and tests: fewer than pushes when grouped)
        self.pushes = 0

    @contextlib.contextmanager
    def pushing(self) -> Iterator[None]:
        """A push on its way to ``submit``: a leader waits for it (up to ``wait_s``)."""
        with self._cv:
            self._coming += 1
        self._mine.coming = True
        try:
            yield
        finally:
            if getattr(self._mine, "coming", False):  # it wrote nothing: a leader need not wait for it
                self._mine.coming = False
                with self._cv:
                    self._coming -= 1
                    self._cv.notify_all()

    def submit(self, run_id: str, gpu: Sequence[Row], host: Sequence[Row]) -> int:
        """Write the rows with the batch they join; the rows stored, once they are. Raises
        ``failed(exc)`` when the batch's flush failed (nothing of the push may be acknowledged)."""
        push = Push(run_id, gpu, host)
        with self._cv:
            if getattr(self._mine, "coming", False):
                self._mine.coming = False
                self._coming -= 1
            batch = self._open
            leader = batch is None
            if batch is None:
                batch = self._open = _Batch(self._clock())
            batch.pushes.append(push)
            batch.rows += len(gpu) + len(host)
            self.pushes += 1
            self._cv.notify_all()
            if not leader:
                while not batch.done:
                    self._cv.wait()
            else:
                while (left := self._left(batch)) != 0:
                    self._cv.wait(left)
                self._open, self._flushing = None, True  # pushes from now on gather the next batch
        if leader:
            self._write(batch)
        if push.error is not None:
            raise push.error
        return push.stored

    def _left(self, batch: _Batch) -> float | None:
        """0 when the batch is to be flushed now; else how long to wait at most (None: until told)."""
        if self._flushing:
            return None  # one flush at a time: the batch gathers on until it ends
        if batch.rows >= self.rows or self._coming <= 0:
            return 0
        return max(0.0, batch.started + self.wait_s - self._clock())

    def _write(self, batch: _Batch) -> None:
        try:
            stored = self._flush(batch.pushes)
            for push, n in zip(batch.pushes, stored, strict=True):
                push.stored = n
        except BaseException as exc:  # every member fails with it: none is acknowledged
            for push in batch.pushes:
                push.error = self._failed(exc)
        finally:
            with self._cv:
                self.flushes += 1
                batch.done, self._flushing = True, False
                self._cv.notify_all()
