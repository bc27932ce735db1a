"""The agent's ledger side: one thread that writes discovered runs, resumes them, and never blocks a tick.

The loop hands it operations (a run created, GPUs added, a closed interval, a change of the record)
keyed by the track's local id; this thread applies them in order. A ledger that is locked, down or
unreachable costs a retry with backoff (1 s doubling to 60 s), said once on stderr and once when it
is back; nothing is dropped. Because the ledger may be unreachable when the agent starts, resuming
happens here too:

* at the first connection, the open discovered runs of this host are loaded; those recorded before
  the last boot (another ``boot_id``) are ended at once, at their last interval;
* a run created by the loop whose owner key matches an open run and that shares a live process
  with it (pid and start time, from the run's metadata) *is* that run: it is adopted — same id,
  intervals numbered after those the ledger holds, labels and metadata brought up to date;
* once the loop has completed its first interval (``settle``), the open runs nobody adopted had
  ended while the agent was away: they are ended at their last interval.

It also keeps, every ``RECORDERS_EVERY_S``, the pids of the recorders of runs ``running`` on this
host (``recorders``: the wrapped-run rule of core/metering/owners.py) and the GPUs the open runs of this host
hold with their recorders (``holds``: held time in the capacity ledger while the recorder lives), and
writes the agent's capacity intervals
and GPU sightings (store/capacity.py) in order with the rest.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuledger.core.capacity.model import CapacityInterval, Sighting
from gpuledger.core.model import GpuIdentity, RunRecord
from gpuledger.node.track import META_KEY, Closed
from gpuledger.store.capacity import write_capacity
from gpuledger.store.capacity_queries import RunHold, held_by_open_runs

RECORDERS_EVERY_S = 5.0  # a wrapped run started after the agent is known within this
BACKOFF_MIN_S, BACKOFF_MAX_S = 1.0, 60.0


@dataclass
class _Target:
    run_id: str  # the ledger's id (the track's own, or the adopted run's)
    gpu_offset: dict[str, int] = field(default_factory=dict)
    host_offset: int = 0


@dataclass
class _Op:
    kind: str  # create / devices / append / update / log / settle / capacity
    local_id: str = ""
    payload: Any = None


class LedgerSink:
    """See the module doc. ``pusher`` (node/push.py), when given, is told about every run written."""

    def __init__(
        self,
        url: str | None,
        *,
        host: str,
        boot_id: str | None,
        warn: Callable[[str], None],
        pusher: Any = None,
        ledger_factory: Callable[[str | None], Any] | None = None,
    ) -> None:
        self._url = url
        self._host = host
        self._boot_id = boot_id
        self._warn = warn
        self._pusher = pusher
        self._factory = ledger_factory
        self._ops: collections.deque[_Op] = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._ledger: Any = None
        self._stale: dict[str, RunRecord] | None = None  # open discovered runs of this host, by id
        self._targets: dict[str, _Target] = {}
        self._failures = 0
        self._said_down = False
        self._recorders_at = 0.0
        self.recorders: dict[int, str] = {}  # recorder pid -> run id (snapshot, replaced whole)
        self.holds: tuple[RunHold, ...] = ()  # the open runs of this host and the GPUs they hold (snapshot)
        self.adopted: dict[str, str] = {}  # local id -> the resumed run's id
        self.written_at: float | None = None
        self._thread = threading.Thread(target=self._loop, name="gpuledger-agent-ledger", daemon=True)

    # -- the loop's side ----------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def create(self, run: RunRecord, devices: list[GpuIdentity], members: dict[int, int]) -> None:
        self._put(_Op("create", run.id, (run, list(devices), dict(members))))

    def add_devices(self, local_id: str, devices: list[GpuIdentity]) -> None:
        self._put(_Op("devices", local_id, list(devices)))

    def append(self, local_id: str, closed: Closed) -> None:
        if closed.gpu or closed.host is not None or closed.events or closed.metrics:
            self._put(_Op("append", local_id, closed))

    def log(self, local_id: str, data: bytes, truncated: bool) -> None:
        """The run's log as stored (capped, redacted); it replaces what the ledger had."""
        self._put(_Op("log", local_id, (data, truncated)))

    def update(self, local_id: str, **fields: Any) -> None:
        self._put(_Op("update", local_id, fields))

    def capacity(self, intervals: list[CapacityInterval], sightings: list[Sighting]) -> None:
        """The node's GPUs' capacity states since the last boundary, and where they were seen."""
        if intervals or sightings:
            self._put(_Op("capacity", payload=(list(intervals), list(sightings))))

    def settle(self) -> None:
        """The loop has seen every GPU process once: open runs nobody adopted may be ended."""
        self._put(_Op("settle"))

    def run_id(self, local_id: str) -> str:
        return self.adopted.get(local_id, local_id)

    def pending(self) -> int:
        with self._lock:
            return len(self._ops)

    def close(self, timeout_s: float = 10.0) -> bool:
        """Write what is queued within ``timeout_s``; True when nothing is left."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        if not self._thread.is_alive() and self._ledger is not None:
            self._ledger.close()
        return self.pending() == 0

    def _put(self, op: _Op) -> None:
        with self._lock:
            self._ops.append(op)
        self._wake.set()

    # -- the thread ---------------------------------------------------------------------------
    def _loop(self) -> None:
        next_try = 0.0
        while True:
            stopping = self._stop.is_set()
            if time.monotonic() >= next_try or stopping:
                try:
                    self._work()
                    self._recovered()
                    next_try = 0.0
                except Exception as exc:  # locked, down, refused: keep everything, try again later
                    next_try = time.monotonic() + self._failed(exc)
            if stopping and (self.pending() == 0 or time.monotonic() < next_try):
                return
            self._wake.wait(1.0 if next_try == 0.0 else max(0.05, min(1.0, next_try - time.monotonic())))
            self._wake.clear()

    def _work(self) -> None:
        ledger = self._open()
        now = time.monotonic()
        if now - self._recorders_at >= RECORDERS_EVERY_S:
            self._recorders_at = now
            self.recorders = {r.recorder_pid: r.id for r in ledger.list_runs(status="running", limit=1000)
                              if r.host == self._host and r.recorder_pid is not None}  # fmt: skip
            self.holds = tuple(ledger.read(lambda conn: held_by_open_runs(conn, self._host)))
        wrote: set[str] = set()
        while True:
            with self._lock:
                if not self._ops:
                    break
                op = self._ops[0]
            self._apply(ledger, op)
            with self._lock:
                self._ops.popleft()
            if op.kind not in ("settle", "capacity"):
                wrote.add(self.run_id(op.local_id))
            elif op.kind == "capacity" and self._pusher is not None:
                self._pusher.wrote([])  # wakes it: capacity rows are pushed with the runs
        if wrote:
            self.written_at = time.time()
            if self._pusher is not None:
                self._pusher.wrote(sorted(wrote))

    def _open(self) -> Any:
        if self._ledger is None:
            if self._factory is not None:
                self._ledger = self._factory(self._url)
            else:
                from gpuledger.store import Ledger

                self._ledger = Ledger(self._url)
        if self._stale is None:
            self._load_stale(self._ledger)
        return self._ledger

    def _load_stale(self, ledger: Any) -> None:
        from gpuledger.store import codec
        from gpuledger.store.queries import open_discovered_on

        rows = ledger.read(lambda conn: open_discovered_on(conn, self._host))
        stale = {}
        for row in rows:
            run = codec.run_from_row(row)
            if (run.meta.get(META_KEY) or {}).get("boot_id") != self._boot_id:
                self._end_orphan(ledger, run, "the machine rebooted while the agent was not running")
            else:
                stale[run.id] = run
        self._stale = stale

    def _apply(self, ledger: Any, op: _Op) -> None:
        if op.kind == "create":
            self._create(ledger, *op.payload)
        elif op.kind == "devices":
            ledger.add_devices(self.run_id(op.local_id), op.payload)
        elif op.kind == "append":
            self._append(ledger, op.local_id, op.payload)
        elif op.kind == "update":
            self._update(ledger, op.local_id, dict(op.payload))
        elif op.kind == "log":
            data, truncated = op.payload
            ledger.set_log(self.run_id(op.local_id), data, truncated=truncated)
        elif op.kind == "capacity":
            intervals, sightings = op.payload
            try:
                ledger.write(lambda conn: write_capacity(ledger.database, conn, intervals, sightings))
            except ValueError as exc:  # states that do not add up: a bug, and retrying cannot fix it
                self._warn(f"gpuledger agent: capacity intervals not stored: {exc}")
        elif op.kind == "settle":
            for run in list((self._stale or {}).values()):
                self._end_orphan(ledger, run, "its processes had left the GPUs when the agent started again")
            self._stale = {}

    def _create(self, ledger: Any, run: RunRecord, devices: list[GpuIdentity], members: dict[int, int]) -> None:
        old = self._adoptable(run, members)
        if old is None:
            ledger.create_run(run)
            if devices:
                ledger.add_devices(run.id, devices)
            self._targets[run.id] = _Target(run.id)
            return
        gpu = {uuid: int(t["count"]) for uuid, t in ledger.gpu_totals(old.id).items()}
        host = int(ledger.host_totals(old.id)["count"] or 0)
        if devices:
            ledger.add_devices(old.id, devices)
        meta = {**old.meta, META_KEY: {**(old.meta.get(META_KEY) or {}), **(run.meta.get(META_KEY) or {})}}
        ledger.update_run(old.id, labels={**old.labels, **run.labels}, meta=meta)
        self._targets[run.id] = _Target(old.id, gpu, host)
        self.adopted[run.id] = old.id
        assert self._stale is not None
        del self._stale[old.id]

    def _adoptable(self, run: RunRecord, members: dict[int, int]) -> RunRecord | None:
        key = (run.meta.get(META_KEY) or {}).get("key")
        for old in (self._stale or {}).values():
            node = old.meta.get(META_KEY) or {}
            if node.get("key") != key:
                continue
            kept = {(int(p), int(s)) for p, s in node.get("members") or []}
            if kept & set(members.items()):
                return old
        return None

    def _append(self, ledger: Any, local_id: str, closed: Closed) -> None:
        target = self._targets.get(local_id) or _Target(local_id)
        gpu = [_renumber(iv, target.gpu_offset.get(iv.device_uuid, 0)) for iv in closed.gpu]
        host = None
        if closed.host is not None:
            host = _renumber(closed.host, target.host_offset)
        ledger.append(target.run_id, gpu, [host] if host is not None else [], closed.events, closed.metrics)

    def _update(self, ledger: Any, local_id: str, fields: dict[str, Any]) -> None:
        run_id = self.run_id(local_id)
        if "meta" in fields:  # merged with what the ledger holds (a resumed run keeps its history)
            stored = ledger.get_run(run_id)
            fields["meta"] = {**stored.meta, **fields["meta"]}
        if "labels" in fields:
            stored_labels = ledger.get_run(run_id).labels
            fields["labels"] = {**stored_labels, **fields["labels"]}
        ledger.update_run(run_id, **fields)

    def _end_orphan(self, ledger: Any, run: RunRecord, why: str) -> None:
        last = ledger.last_flush_t(run.id)
        ledger.update_run(run.id, ended_at=max(run.started_at, last if last is not None else run.started_at),
                          status_reason=f"ended by the node agent: {why}")  # fmt: skip
        if self._pusher is not None:
            self._pusher.wrote([run.id])

    # -- failures -----------------------------------------------------------------------------
    def _failed(self, exc: Exception) -> float:
        self._failures += 1
        if self._ledger is not None and self._stale is None:
            self._ledger = None  # opened but could not read: open afresh next time
        if not self._said_down:
            self._said_down = True
            self._warn(f"gpuledger agent: cannot write to the ledger ({exc}); discovered runs are kept in memory "
                       "and written when it is back")  # fmt: skip
        return min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2 ** min(self._failures - 1, 16))

    def _recovered(self) -> None:
        if self._said_down:
            self._said_down = False
            self._warn("gpuledger agent: the ledger is writable again; buffered intervals were written")
        self._failures = 0


def _renumber(interval: Any, offset: int) -> Any:
    return dataclasses.replace(interval, seq=interval.seq + offset) if offset else interval
