"""Run snapshots read from a ledger: what the team server's ``/metrics`` exposes.

Runs recording now and runs ended within ``recent_s`` (so a scrape sees how a run ended), newest
first and at most ``max_runs``. Counters are the sums of the stored intervals, gauges the latest
stored interval.

A scrape must not cost more as runs grow longer, so the sums are kept per process and advanced
incrementally: each (run, device) has a cursor, the first interval seq not yet added, and a scrape
reads only the intervals at or after it (a primary-key range). The first time a process sees a run,
it sums the run's stored intervals in SQL (one grouped read). Sums are kept in integer micro-units
(µs, mJ), the same arithmetic in SQL and here, so they are exact and do not depend on the order or
grouping of the additions: every replica of the server, however long it has been up, publishes the
same value for the same stored intervals. Throttle time counts the reasons the collectors record
(names.THROTTLE_REASONS).

Intervals of a device arrive in seq order (the agent's outbox pushes them so); a cursor only moves
over contiguous seqs, so an interval that arrives late is still counted. A gap that stays open for
``gap_grace_s`` is skipped (that interval was lost); if it arrives after that, it is counted by
processes that read the run afterwards, not by this one. Rollups that merge stored intervals keep
the sums, so they change nothing here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuledger.prom.names import THROTTLE_REASONS
from gpuledger.prom.series import MICRO, MILLI, GpuFigures, RunFigures, RunKey, scaled
from gpuledger.prom.series import add as _add
from gpuledger.prom.series import units as _units
from gpuledger.store import metrics_queries as mq

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from gpuledger.store import Ledger

RECENT_S = 3600.0
MAX_RUNS = 1000
GAP_GRACE_S = 60.0


@dataclass
class _Cursor:
    """What this process has added of one series (a run's device, or its host): seqs < next_seq."""

    next_seq: int = 0
    gap_since: float | None = None

    def accept(self, seq: int, now: float, grace_s: float) -> bool | None:
        """True: add the row; False: already added; None: a gap before it, stop here for now."""
        if seq < self.next_seq:
            return False
        if seq > self.next_seq:
            if self.gap_since is None:
                self.gap_since = now
            if now - self.gap_since < grace_s:
                return None
        self.next_seq, self.gap_since = seq + 1, None
        return True


@dataclass
class _Device:
    cursor: _Cursor = field(default_factory=_Cursor)
    busy_us: int | None = None
    energy_mj: int | None = None
    throttle_us: dict[str, int] = field(default_factory=dict)
    power_w: float | None = None
    memory_used_b: int | None = None
    temperature_c: float | None = None

    def add(self, row: Mapping[str, Any]) -> None:
        self.busy_us = _add(self.busy_us, _units(row["busy_s"], MICRO))
        self.energy_mj = _add(self.energy_mj, _units(row["energy_j"], MILLI))
        throttle = row["throttle_s"] or {}
        for reason in THROTTLE_REASONS:
            us = _units(throttle.get(reason), MICRO)
            if us is not None:
                self.throttle_us[reason] = self.throttle_us.get(reason, 0) + us
        self.gauges(row)

    def gauges(self, row: Mapping[str, Any]) -> None:
        self.power_w = _float(row["power_max_w"])
        self.memory_used_b = row["mem_used_last_b"]
        self.temperature_c = _float(row["temp_max_c"])

    @classmethod
    def from_sums(cls, sums: Mapping[str, Any]) -> _Device:
        dev = cls(
            cursor=_Cursor(next_seq=int(sums["last_seq"]) + 1),
            busy_us=_int(sums["busy_us"]),
            energy_mj=_int(sums["energy_mj"]),
        )
        for reason in THROTTLE_REASONS:
            us = _int(sums[f"throttle_{reason}"])
            if us is not None:
                dev.throttle_us[reason] = us
        return dev


@dataclass
class _Run:
    devices: dict[str, _Device] = field(default_factory=dict)
    host: _Cursor = field(default_factory=_Cursor)
    cpu_us: int | None = None


@dataclass
class _Fetched:
    runs: list[dict[str, Any]]
    devices: list[dict[str, Any]]
    gpu: list[dict[str, Any]]  # new intervals of runs already summed
    host: list[dict[str, Any]]
    gpu_sums: list[dict[str, Any]]  # runs seen for the first time: their sums ...
    host_sums: list[dict[str, Any]]
    last_rows: list[dict[str, Any]]  # ... and their latest intervals (gauges)
    series_only: list[dict[str, Any]] = field(default_factory=list)  # series-only runs' sums, every scrape
    series_only_host: list[dict[str, Any]] = field(default_factory=list)  # ... and their CPU time


class LedgerSource:
    """The figures of a ledger's live runs, kept up to date scrape by scrape (thread-safe)."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        recent_s: float = RECENT_S,
        max_runs: int = MAX_RUNS,
        gap_grace_s: float = GAP_GRACE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._ledger = ledger
        self.recent_s, self.max_runs, self.gap_grace_s = recent_s, max_runs, gap_grace_s
        self._clock = clock
        self._lock = threading.Lock()
        self._runs: dict[str, _Run] = {}
        self.rows_read = 0  # interval rows the last scrape read (the cost of a scrape)

    def figures(self, scope: mq.Scope = None) -> list[RunFigures]:
        """``scope``: projects the reader may see; None means all of them."""
        with self._lock:
            now = self._clock()
            gpu_cursors, host_cursors, known = self._cursors()
            fetched = self._ledger.read(  # the ledger's retrying read: _fetch only reads
                lambda conn: self._fetch(conn, now, scope, gpu_cursors, host_cursors, known)
            )
            self._apply(fetched, now)
            return self._snapshot(fetched)

    # -- the three steps -------------------------------------------------------------------
    def _cursors(self) -> tuple[list[tuple[str, str, int]], list[tuple[str, int]], set[str]]:
        gpu = [(r, u, d.cursor.next_seq) for r, run in self._runs.items() for u, d in run.devices.items()]
        host = [(r, run.host.next_seq) for r, run in self._runs.items()]
        return gpu, host, set(self._runs)

    def _fetch(
        self,
        conn: Connection,
        now: float,
        scope: mq.Scope,
        gpu_cursors: list[tuple[str, str, int]],
        host_cursors: list[tuple[str, int]],
        known: set[str],
    ) -> _Fetched:
        runs = mq.live_runs(conn, ended_since=now - self.recent_s, limit=self.max_runs, scope=scope)
        ids = [r["id"] for r in runs]
        wanted = set(ids)
        new = [i for i in ids if i not in known]
        # A new run is summed in SQL, unless a series has a gap in its seqs: then it is read row by row
        # from seq 0 (rare), so the cursor waits for the missing interval as it would have here.
        tiered = self._ledger.series_reads is not None  # serve --series: tiered and dropped days count
        sums = mq.whole_gpu_sums(conn, new, THROTTLE_REASONS, tiered=tiered) if new else []
        gpu_sums = [g for g in sums if g["count"] == g["last_seq"] + 1]
        gpu_cursors = [c for c in gpu_cursors if c[0] in wanted]
        gpu_cursors += [(g["run_id"], g["device_uuid"], 0) for g in sums if g["count"] != g["last_seq"] + 1]
        hsums = mq.whole_host_sums(conn, new, tiered=tiered) if new else []
        host_sums = [h for h in hsums if h["count"] == h["last_seq"] + 1]
        host_cursors = [c for c in host_cursors if c[0] in wanted]
        host_cursors += [(h["run_id"], 0) for h in hsums if h["count"] != h["last_seq"] + 1]
        # no row of theirs reaches the interval tables for a cursor to read: their sums, read whole
        only_gpu, only_host = mq.series_only_sums(conn, ids, THROTTLE_REASONS) if ids else ([], [])
        return _Fetched(
            runs=runs,
            devices=mq.device_rows(conn, ids) if ids else [],
            gpu=mq.new_gpu_rows(conn, gpu_cursors),
            host=mq.new_host_rows(conn, host_cursors),
            gpu_sums=gpu_sums,
            host_sums=host_sums,
            last_rows=mq.gpu_rows_at(conn, [(g["run_id"], g["device_uuid"], g["last_seq"]) for g in gpu_sums]),
            series_only=only_gpu,
            series_only_host=only_host,
        )

    def _apply(self, fetched: _Fetched, now: float) -> None:
        self.rows_read = len(fetched.gpu) + len(fetched.host)
        for r in fetched.runs:
            self._runs.setdefault(r["id"], _Run())
        for sums in fetched.gpu_sums:
            self._runs[sums["run_id"]].devices[sums["device_uuid"]] = _Device.from_sums(sums)
        for row in fetched.last_rows:
            self._runs[row["run_id"]].devices[row["device_uuid"]].gauges(row)
        for sums in fetched.series_only:  # replaced, not added: they are the run's whole sums
            dev = self._runs[sums["run_id"]].devices[sums["device_uuid"]] = _Device.from_sums(sums)
            dev.gauges(sums)  # of its latest row
        for sums in fetched.series_only_host:
            self._runs[sums["run_id"]].cpu_us = _int(sums["cpu_us"])
        for sums in fetched.host_sums:
            run = self._runs[sums["run_id"]]
            run.host, run.cpu_us = _Cursor(next_seq=int(sums["last_seq"]) + 1), _int(sums["cpu_us"])
        blocked: set[tuple[str, str]] = set()
        for row in fetched.gpu:  # ordered by run, device, seq
            key = (row["run_id"], row["device_uuid"])
            if key in blocked:
                continue
            dev = self._runs[key[0]].devices.setdefault(key[1], _Device())
            verdict = dev.cursor.accept(row["seq"], now, self.gap_grace_s)
            if verdict is None:
                blocked.add(key)
            elif verdict:
                dev.add(row)
        stopped: set[str] = set()
        for row in fetched.host:
            run = self._runs[row["run_id"]]
            if row["run_id"] in stopped:
                continue
            verdict = run.host.accept(row["seq"], now, self.gap_grace_s)
            if verdict is None:
                stopped.add(row["run_id"])
            elif verdict:
                run.cpu_us = _add(run.cpu_us, _units(row["cpu_s"], MICRO))
        # Forget runs that left the live set (ended long ago, deleted); a scoped read keeps the rest.
        if len(self._runs) > 2 * self.max_runs:
            live = {r["id"] for r in fetched.runs}
            self._runs = {k: v for k, v in self._runs.items() if k in live}

    def _snapshot(self, fetched: _Fetched) -> list[RunFigures]:
        devices: dict[str, list[dict[str, Any]]] = {}
        for d in fetched.devices:
            devices.setdefault(d["run_id"], []).append(d)
        out = []
        for r in fetched.runs:
            run = self._runs[r["id"]]
            gpus = {
                d["uuid"]: GpuFigures(uuid=d["uuid"], index=d["index"], memory_total_b=d["memory_total_b"])
                for d in devices.get(r["id"], [])
            }
            for uuid, dev in run.devices.items():
                fig = gpus.setdefault(uuid, GpuFigures(uuid=uuid))
                fig.busy_s, fig.energy_j = scaled(dev.busy_us, MICRO), scaled(dev.energy_mj, MILLI)
                fig.throttle_s = {k: v / MICRO for k, v in dev.throttle_us.items()}
                fig.power_w, fig.memory_used_b, fig.temperature_c = dev.power_w, dev.memory_used_b, dev.temperature_c
            out.append(
                RunFigures(
                    key=RunKey(r["id"], r["project"] or "", r["team"] or "", r["user"] or ""),
                    name=r["name"] or "",
                    status=r["status"],
                    replayed=bool(r.get("replayed")),
                    started_at=r["started_at"],
                    ended_at=r["ended_at"],
                    cpu_s=scaled(run.cpu_us, MICRO),
                    gpus=sorted(gpus.values(), key=_order),
                )
            )
        return out


def _int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def _float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _order(fig: GpuFigures) -> tuple[int, str]:
    return (fig.index if fig.index is not None else 1 << 30, fig.uuid)
