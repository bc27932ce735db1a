"""Live ingest into a series store (docs/SCALE.md, "Live ingest"): ``serve --series URL
--series-live`` writes each push's new GPU and host intervals into the store inside the push's
ledger transaction (store/ingest.py), after the ledger took them and before it commits, so the
agent is acknowledged only when both hold them; a store that fails rolls the ledger back and the
push is answered 503 (the agent keeps its outbox and sends again).

Exactly once, on both stores:

- only the rows the ledger newly inserted go to the store: a resent batch the ledger already
  holds writes nothing, and the run's row lock (store/ingest.py) keeps two replicas' pushes of one
  run from writing the store at once;
- each write carries the token ``<run>:<device>:<first seq>-<last seq>`` (several devices or
  the host: their ranges joined, hashed when long), the store's dedup token (series/clickhouse.py);
- a store write that succeeded under a ledger transaction that then failed (a replica killed
  between the two) leaves rows the ledger lacks; the agent's resend, possibly batched otherwise,
  would carry another token. The compact PostgreSQL store drops those rows on its (stream, seq)
  key; ClickHouse has no unique key, so the rows it already holds are looked up by key first
  (``ClickHouseSeries.held``) and left out. A write killed between its raw part and its rollup
  views' parts left those rows without their rollups, which a resend leaving them out would never
  add: where the lookup finds rows, their runs', GPUs' and days' rollups are checked against the
  raw rows and the missing sums added (``ClickHouseSeries.repair_rollups``, series/clickhouse_repair.py).

A capacity push's new intervals (``POST /api/v1/capacity``, store/capacity.py) go into the
store the same way, in the push's transaction, with the token of series/capacity.token; both
stores leave out a capacity row they hold by its (GPU, start), the ledger's own key.

Group commit (ClickHouse, ``serve --series-batch-rows/--series-batch-ms``, store/series_batch.py):
concurrent pushes' new rows are written by one insert per table, each push waiting inside its
own ledger transaction, with its run's lock, for the flush that carries its rows. It stays
exactly once because the store's rows are left out before every flush (one ``held_group`` read
for the whole batch) and a run's pushes never meet in two flushes at once (the run's lock, across
replicas too): a member whose ledger commit then fails is resent, in another group or alone, and
its rows are held already. The group's token is the sha256 of its members' sorted tokens. The
compact PostgreSQL store keeps one write per push on a connection of its own (up to
``connections`` at once): its cost is per row (index entries), and PostgreSQL already groups
concurrent commits' WAL flushes.

Retention later tiers these days without copying them again (``fill_only``): what the store holds
is read back and checked as any tiered day, and ``run.raw_tiered`` recorded (store/series_tier.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

from gpuledger.series import capacity
from gpuledger.series.base import SeriesStore
from gpuledger.series.open import CLICKHOUSE_SCHEMES
from gpuledger.store import series_compact_read as pages
from gpuledger.store import series_only_verify, series_tier
from gpuledger.store.series_batch import GroupCommit, Push

Row = Mapping[str, Any]
T = TypeVar("T")
MAX_TOKEN = 200  # longer descriptions of a batch are hashed
RETRY_AFTER_S = 5
BATCH_ROWS, BATCH_MS = 10_000, 1000.0  # group commit's defaults: a flush at this many rows or this wait


class SeriesUnavailable(RuntimeError):
    """The series store did not take a push's rows: nothing of the push was kept; send it again."""


def batch_token(run_id: str, gpu: Sequence[Row], host: Sequence[Row]) -> str:
    """``run:device:first-last`` for one device; every device's range and the host's (``host:``)
    joined for more, hashed past MAX_TOKEN characters. The same rows give the same token."""
    spans: dict[str, list[int]] = {}
    for r in gpu:
        s = spans.setdefault(str(r["device_uuid"]), [int(r["seq"]), int(r["seq"])])
        s[0], s[1] = min(s[0], int(r["seq"])), max(s[1], int(r["seq"]))
    parts = [f"{d}:{a}-{b}" for d, (a, b) in sorted(spans.items())]
    if host:
        seqs = [int(r["seq"]) for r in host]
        parts.append(f"host:{min(seqs)}-{max(seqs)}")
    text = f"{run_id}:{','.join(parts)}"
    if len(text) <= MAX_TOKEN:
        return text
    return f"{run_id}:sha256:{hashlib.sha256(text.encode()).hexdigest()}"


def group_token(tokens: Sequence[str]) -> str:
    """A group commit's token: its members' tokens sorted and hashed (the same members, the same token)."""
    return "group:sha256:" + hashlib.sha256("\n".join(sorted(tokens)).encode()).hexdigest()


def _joined(pushes: Sequence[Push]) -> dict[str, tuple[list[Row], list[Row]]]:
    """run -> its rows in the group, each (device, seq) or host seq once (a run's pushes meet in
    one group only when not under the ledger's run lock: direct callers)."""
    out: dict[str, tuple[list[Row], list[Row]]] = {}
    seen: set[tuple[str, str, int]] = set()
    for p in pushes:
        gpu, host = out.setdefault(p.run_id, ([], []))
        for r in p.gpu:
            if (key := (p.run_id, str(r["device_uuid"]), int(r["seq"]))) not in seen:
                seen.add(key)
                gpu.append(r)
        for r in p.host:
            if (key := (p.run_id, "", int(r["seq"]))) not in seen:
                seen.add(key)
                host.append(r)
    return out


def _clickhouse(url: str) -> bool:
    return urlsplit(url).scheme.lower() in CLICKHOUSE_SCHEMES


def _unheld(store: Any, run_id: str, gpu: Sequence[Row], host: Sequence[Row]) -> tuple[list[Row], list[Row]]:
    """The batch less the rows the ClickHouse store already holds (``ClickHouseSeries.held``, by
    key); where it holds GPU rows, their rollups repaired first (``_repair``)."""
    gpu_held, host_held = store.held(run_id, gpu, host)
    _repair(store, [(run_id, gpu, gpu_held)])
    return (
        [r for r in gpu if (str(r["device_uuid"]), int(r["seq"])) not in gpu_held],
        [r for r in host if int(r["seq"]) not in host_held],
    )


def _repair(store: Any, held: Sequence[tuple[str, Sequence[Row], set[tuple[str, int]]]]) -> None:
    """(run, GPU rows, the (device, seq)s of them the store holds) of a push or group: rows held
    are rows an earlier write stored whose push was not acknowledged (a kill, a failed ledger
    commit), maybe killed between the raw part and the rollup views' parts. They are never sent
    again (another grouping would carry another token), so the rollups of their runs, GPUs and days
    are checked against the raw rows and made whole (``ClickHouseSeries.repair_rollups``). Rare:
    nothing is read when nothing is held."""
    found = [
        (run, [r for r in gpu if (str(r["device_uuid"]), int(r["seq"])) in keys]) for run, gpu, keys in held if keys
    ]
    if found:
        store.repair_rollups(found)


def keyed(store: Any) -> bool:
    """Whether ``store`` finds held rows by key and repairs their rollups (ClickHouseSeries; a
    wrapper passes the method on): its writers leave held rows out through ``lacking``."""
    return callable(getattr(store, "repair_rollups", None))


def lacking(
    store: Any, run_id: str, gpu: Sequence[Row], host: Sequence[Row], page: int = 10_000
) -> tuple[list[Row], list[Row]]:
    """The rows of a batch the store lacks (by device and seq, the host's by seq), for writers that
    leave out what it holds and write the rest under a token of their own (tiering: ``_FillOnly``;
    the compact migration: store/series_compact.copy_rows). ClickHouse: ``_unheld``, read by key,
    the rollups of the rows held repaired, since the write that stored them may have been killed
    before its views' parts and the rows are never sent again; another store: its rows in each
    stream's seq range of the batch, ``page`` rows a read, so a long run is never read whole."""
    if keyed(store):
        return _unheld(store, run_id, gpu, host)
    spans: dict[str, tuple[int, int]] = {}
    for r in gpu:
        uuid, seq = str(r["device_uuid"]), int(r["seq"])
        lo, hi = spans.get(uuid, (seq, seq))
        spans[uuid] = (min(lo, seq), max(hi, seq))
    have_gpu = {
        (uuid, int(r["seq"]))
        for uuid, (lo, hi) in spans.items()
        for rows in pages.store_gpu_pages(store, run_id, uuid, page, after=lo - 1, upto=hi)
        for r in rows
    }
    seqs = [int(r["seq"]) for r in host]
    held = pages.store_host_pages(store, run_id, page, after=min(seqs) - 1, upto=max(seqs)) if seqs else []
    have_host = {int(r["seq"]) for rows in held for r in rows}
    return (
        [r for r in gpu if (str(r["device_uuid"]), int(r["seq"])) not in have_gpu],
        [r for r in host if int(r["seq"]) not in have_host],
    )


class LiveSeries:
    """The series store a server writes pushes into. ClickHouse: one store shared by the
    process's threads (chDB holds one folder per process), writes taking turns; the compact
    PostgreSQL store: one store (a connection of its own) per concurrent writer, at most
    ``connections``, a broken one replaced."""

    def __init__(
        self, url: str, *, connections: int = 8, create: bool = False, batch_rows: int = 0, batch_ms: float = BATCH_MS
    ) -> None:
        """``create``: make the store's tables first (``serve`` makes them once, before its
        workers start, so that they do not race each other making them). ``batch_rows`` > 0
        (ClickHouse): concurrent pushes are written by one flush once that many rows wait, or
        ``batch_ms`` after the first, or when no other push is on its way (``pushing``); 0: one
        insert per push."""
        if batch_rows < 0 or not batch_ms >= 0:
            raise ValueError(f"series batch rows and ms are 0 or more, not {batch_rows} and {batch_ms}")
        self.url = url
        self._create = create
        self.shown = series_tier.shown_url(url)
        self.shared = _clickhouse(url)
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(1 if self.shared else connections)
        self._idle: list[SeriesStore] = [self._open()]
        self.reader: str | SeriesStore = self._idle[0] if self.shared else url  # for Ledger(series=)
        self.group: GroupCommit | None = None
        if self.shared and batch_rows > 0:
            self.group = GroupCommit(self._flush, rows=batch_rows, wait_s=batch_ms / 1000, failed=self._failed)

    def pushing(self) -> contextlib.AbstractContextManager[None]:
        """Around a push that holds its run's lock and may ``write``: a group waits for it."""
        return self.group.pushing() if self.group is not None else contextlib.nullcontext()

    def _open(self) -> SeriesStore:
        try:
            store = series_tier.open_store(self.url, create=self._create)
            self._create = False  # once is enough
            return store
        except Exception as exc:
            raise SeriesUnavailable(f"the series store {self.shown} cannot be opened: {exc}") from exc

    def _use(self, work: Callable[[SeriesStore], T], failed: str) -> T:
        """``work`` on a store of the pool (opened where none is idle); SeriesUnavailable, with
        ``failed`` in its message, when the store fails it (a PostgreSQL store's connection, which
        may be broken, is then closed, not reused)."""
        with self._slots:
            with self._lock:
                store = self._idle.pop() if self._idle else None
            try:
                store = store or self._open()
                return work(store)
            except SeriesUnavailable:
                raise
            except Exception as exc:
                if store is not None and not self.shared:
                    store.close()
                    store = None
                raise SeriesUnavailable(f"the series store {self.shown} {failed}: {exc}") from exc
            finally:
                if store is not None:
                    with self._lock:
                        self._idle.append(store)

    def write(self, run_id: str, gpu: Sequence[Row], host: Sequence[Row]) -> int:
        """Store the rows (ledger rows without run_id) once: the rows stored by this call.
        SeriesUnavailable when the store does not take them."""
        if not gpu and not host:
            return 0
        if self.group is not None:
            return self.group.submit(run_id, gpu, host)

        def work(store: SeriesStore) -> int:
            g, h = _unheld(store, run_id, gpu, host) if self.shared else (gpu, host)
            if not g and not h:
                return 0
            return store.write(run_id, g, h, token=batch_token(run_id, g, h))

        return self._use(work, "did not take the push")

    def _flush(self, pushes: list[Push]) -> list[int]:
        """A group commit (store/series_batch.py): the rows the store lacks of every push, looked up
        at once, written as one insert per table; per push the rows it stored."""
        runs = _joined(pushes)

        def work(store: SeriesStore) -> dict[str, tuple[list[Row], list[Row]]]:
            held = store.held_group([(run, gpu, host) for run, (gpu, host) in runs.items()])  # type: ignore[attr-defined]
            _repair(
                store, [(run, gpu, gpu_held) for (run, (gpu, _)), (gpu_held, _) in zip(runs.items(), held, strict=True)]
            )
            left: dict[str, tuple[list[Row], list[Row]]] = {}
            for (run, (gpu, host)), (gpu_held, host_held) in zip(runs.items(), held, strict=True):
                gpu = [r for r in gpu if (str(r["device_uuid"]), int(r["seq"])) not in gpu_held]
                host = [r for r in host if int(r["seq"]) not in host_held]
                if gpu or host:
                    left[run] = (gpu, host)
            if left:
                token = group_token([batch_token(run, gpu, host) for run, (gpu, host) in left.items()])
                store.write_group([(run, gpu, host) for run, (gpu, host) in left.items()], token)  # type: ignore[attr-defined]
            return left

        left = self._use(work, "did not take the pushes")
        sent = {run: ({(str(r["device_uuid"]), int(r["seq"])) for r in g}, {int(r["seq"]) for r in h})
                for run, (g, h) in left.items()}  # fmt: skip
        out = []
        for p in pushes:  # each row counted for the first push of its run that carried it
            gpu_keys, host_seqs = sent.get(p.run_id, (set(), set()))
            n = 0
            for key in ((str(r["device_uuid"]), int(r["seq"])) for r in p.gpu):
                n += key in gpu_keys
                gpu_keys.discard(key)
            for seq in (int(r["seq"]) for r in p.host):
                n += seq in host_seqs
                host_seqs.discard(seq)
            out.append(n)
        return out

    def _failed(self, exc: BaseException) -> BaseException:
        """What each member of a failed group raises: the push is answered 503, nothing kept."""
        if isinstance(exc, SeriesUnavailable):
            err = SeriesUnavailable(str(exc))
        else:
            err = SeriesUnavailable(f"the series store {self.shown} did not take the pushes: {exc}")
        err.__cause__ = exc
        return err

    def write_capacity(self, rows: Sequence[Row]) -> int:
        """Store a capacity push's new intervals (``gpu_capacity`` rows, series/capacity.py) once,
        with the batch's token: the rows stored. SeriesUnavailable when the store does not take them."""
        if not rows:
            return 0
        token = capacity.token(rows)
        return self._use(lambda store: store.write_capacity(rows, token), "did not take the capacity push")

    def summary(self, run_id: str) -> dict[str, Any]:
        """What the store holds of the run, as tiering records a day (``series_tier.day_summary``:
        per GPU and the host, rows, seq range, sums, sha256) over all its rows and per day
        (``series_only_verify.by_day``), with the store as shown: a series-only run's seal of its
        intervals (store/series_segments.py).
        SeriesUnavailable when the store cannot be read."""

        def work(store: SeriesStore) -> tuple[list[Row], list[Row]]:
            gpu = sorted(store.gpu_intervals(run_id), key=lambda r: (str(r["device_uuid"]), int(r["seq"])))
            return gpu, sorted(store.host_intervals(run_id), key=lambda r: int(r["seq"]))

        gpu, host = self._use(work, "cannot be read")
        # and per day, so that the days the store keeps can be checked once it has dropped the others
        return {
            "series": self.shown,
            **series_tier.day_summary(gpu, host),
            "days": series_only_verify.by_day(gpu, host),
        }

    def close(self) -> None:
        """Close the stores of the PostgreSQL pool; a shared ClickHouse store is the reader the
        ledger was given, and the ledger closes it."""
        with self._lock:
            stores, self._idle = self._idle, []
        for store in stores:
            if store is not self.reader:
                store.close()


class _FillOnly:
    """A store whose ``write`` leaves out the rows it already holds (``lacking``), so tiering a
    day that live ingest wrote copies nothing again, on ClickHouse too, where another token would
    store the rows twice; there the rollups of the rows held are made whole first, which a tiering
    write killed between its raw and view parts left short. Everything else is the store's."""

    def __init__(self, store: SeriesStore) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def write(self, run_id: str, gpu: Sequence[Row], host: Sequence[Row], token: str) -> int:
        gpu, host = lacking(self.store, run_id, gpu, host)
        return self.store.write(run_id, gpu, host, token)  # nothing left: stores nothing, returns 0


def fill_only(tier: series_tier.Tier) -> series_tier.Tier:
    """``tier`` writing only what its store lacks (``_FillOnly``)."""
    if isinstance(tier.store, _FillOnly):
        return tier
    return series_tier.Tier(_FillOnly(tier.store), tier.url, tier.series_days)  # type: ignore[arg-type]
