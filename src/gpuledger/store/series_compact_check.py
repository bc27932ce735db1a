"""What ``gpuledger db migrate --layout compact`` (store/series_compact.py) checks before it moves a
run's raw intervals out of the ledger: whether the run may move at all, and whether the series
store holds exactly the run's rows afterwards.

A run may move when it has ended, its rows match its seal (retention's rule: a tampered run is not
laundered into a fresh seal, an unsealed one waits for ``gpuledger audit seal``), retention never
thinned its rows into 1-minute or 1-hour rows (the seqs they replaced are gone, so segments could
not tell a late replay of them), and every raw day retention dropped of it was tiered into this
store and is still there (``run.raw_tiered``; series_tier.py): the store then holds every row the
run ever had.

The store's rows are checked as tiering checks a day (series_tier.differences): the rows the ledger
holds, per GPU and the host, by count, integer sums and a sha256 of the quantized rows; the rows of
tiered days the ledger dropped against their ``run.raw_tiered`` entries (all of a run's rows, once
retention has dropped every day of it); and no other row. ``Check`` does it a stream and a page at
a time, the summaries kept running (series_tier.Summing), so no run is ever held whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.series import quantum
from gpuledger.store import schema, series_only_verify, series_tier, tiered_totals
from gpuledger.store.partitions import DROPPED_LEVEL
from gpuledger.store.series_segments import HOST
from gpuledger.store.series_tier import GPU_COLUMNS, GPU_SUMS, HOST_COLUMNS, HOST_SUMS, Item, Summing

Row = dict[str, Any]
DROPPED = "run.raw_dropped"  # store/retention_days.py


class CompactError(RuntimeError):
    """The series store does not hold exactly the run's rows: the run stays as it was."""


def why_not(conn: Connection, run_id: str, url: str) -> str | None:
    """Why the run's rows may not move into the store at ``url`` (as shown) yet; None when they may."""
    m = schema.rollup_marks.c
    levels = set(conn.scalars(sa.select(m.level_s).where(m.run_id == run_id)))
    thinned = sorted(level for level in levels if level < DROPPED_LEVEL)
    if thinned:
        return f"retention thinned its intervals to {thinned[-1]} s rows: kept in PostgreSQL"
    if not levels:
        return None
    a = schema.audit_log.c
    q = sa.select(a.payload).where(a.object == f"run:{run_id}", a.action == DROPPED)
    dropped = {str(json.loads(p)["day"]) for p in conn.scalars(q)}
    _, payloads = tiered_totals.dropped(conn, run_id)
    here = [p for p in payloads if p.get("series") == url]
    missing = sorted(dropped - {str(p["day"]) for p in here})
    if missing:
        return f"raw days {', '.join(missing)} were dropped without a copy in {url}: kept as it is"
    expired = sorted({str(p["day"]) for p in here if p.get("expired") and p["day"] in dropped})
    if expired:
        return f"its tiered days {', '.join(expired)} expired from {url}: kept as it is"
    return None


def dropped_parts(conn: Connection, run_id: str, url: str) -> list[Mapping[str, Any]]:
    """The ``run.raw_tiered`` entries into ``url`` of the run's days the ledger dropped since."""
    a = schema.audit_log.c
    q = sa.select(a.payload).where(a.object == f"run:{run_id}", a.action == DROPPED)
    dropped = {str(json.loads(p)["day"]) for p in conn.scalars(q)}
    _, payloads = tiered_totals.dropped(conn, run_id)
    return [p for p in payloads if p.get("series") == url and p["day"] in dropped]


Derive = Callable[[list[Row], list[Row]], None]  # one stream's (ledger rows, store rows the ledger lacks)


class _Stream:
    """One stream's (a GPU's, or the host's) summaries, its rows added in seq order."""

    def __init__(self, gpu: bool) -> None:
        self.sums, self.columns = (GPU_SUMS, GPU_COLUMNS) if gpu else (HOST_SUMS, HOST_COLUMNS)
        self.expected = self.new()  # the ledger's rows, quantized
        self.found = self.new()  # the store's rows of seqs the ledger holds
        self.apart: Summing | None = None  # every row the store holds, once one is not in ``found``
        self.days: dict[str, Summing] = {}  # the same, per day a row starts on
        self.parts: dict[int, Summing] = {}  # per dropped tiered day: the store's rows in its seq range

    def new(self) -> Summing:
        return Summing(self.sums, self.columns)

    @property
    def whole(self) -> Summing:
        return self.found if self.apart is None else self.apart


def _in(seq_range: Sequence[int] | None, seq: int) -> bool:
    return seq_range is not None and seq_range[0] <= seq <= seq_range[1]


class Check:
    """Whether the store holds exactly the run's rows, fed a stream at a time as two seq-ordered
    page sequences, the ledger's and the store's, merged by seq: a few pages of a run are held at
    once, whatever its length. Every row read is also handed to the stream's ``derive`` (the ledger's rows,
    and the store's of seqs the ledger lacks), ``batch`` at a time, for what the migration writes
    from them; ``result`` then raises CompactError unless the store holds exactly the quantized
    ledger rows and the dropped tiered days ``parts`` (their ``run.raw_tiered`` entries), and no
    other row."""

    def __init__(self, run_id: str, parts: Sequence[Mapping[str, Any]], batch: int) -> None:
        self.run_id, self.parts, self.batch = run_id, parts, batch
        self.streams: dict[str, _Stream] = {}  # GPU uuid, or HOST

    def stream(self, key: str, ledger: Iterable[list[Row]], stored: Iterable[list[Row]], derive: Derive) -> None:
        """Merge one stream's rows (``key``: a GPU's uuid, or HOST) by seq."""
        gpu = key != HOST
        s = self.streams[key] = _Stream(gpu)
        quantize = quantum.quantize_gpu if gpu else quantum.quantize_host
        if gpu:
            ranges = [p["gpu"].get(key, {}).get("seq") for p in self.parts]
        else:
            ranges = [p["host"]["seq"] if p.get("host") else None for p in self.parts]
        rows = (r for page in ledger for r in page)
        head = next(rows, None)
        theirs: list[Row] = []  # the ledger's rows passed, not yet summed

        def flush() -> None:
            s.expected.add(quantize(r) for r in theirs)
            derive(theirs, [])
            theirs.clear()

        for page in stored:
            items = [s.found.item(r) for r in page]  # each row's line hashed once, for every summary
            held: list[Item] = []
            lacked: list[Row] = []
            day, run_of_day = "", []  # consecutive rows of one day, added at once
            for r, item in zip(page, items, strict=True):
                seq = item[0]
                while head is not None and int(head["seq"]) < seq:
                    theirs.append(head)
                    head = next(rows, None)
                    if len(theirs) >= self.batch:
                        flush()
                if head is not None and int(head["seq"]) == seq:
                    held.append(item)
                    if s.apart is not None:
                        s.apart.add_items((item,))
                else:
                    if s.apart is None:  # the first row of the store the ledger lacks: the whole goes apart
                        s.found.add_items(held)
                        held = []
                        s.apart = s.found.copy()
                    s.apart.add_items((item,))
                    lacked.append(r)
                if series_only_verify.day_of(r) != day:
                    if run_of_day:
                        s.days.setdefault(day, s.new()).add_items(run_of_day)
                    day, run_of_day = series_only_verify.day_of(r), []
                run_of_day.append(item)
                for i, seq_range in enumerate(ranges):
                    if _in(seq_range, seq):
                        s.parts.setdefault(i, s.new()).add_items((item,))
            if run_of_day:
                s.days.setdefault(day, s.new()).add_items(run_of_day)
            s.found.add_items(held)
            derive([], lacked)
        while head is not None:
            theirs.append(head)
            head = next(rows, None)
            if len(theirs) >= self.batch:
                flush()
        flush()

    def result(self) -> dict[str, Any]:
        """The seal (series_segments.seal): the summary of all the store's rows of the run
        (series_tier.day_summary) and per day (series_only_verify.by_day); CompactError unless
        the store holds exactly the run's rows."""
        host = self.streams.get(HOST)
        gpus = {k: v for k, v in sorted(self.streams.items()) if k != HOST}
        expected = _summary(gpus, host, "expected")
        found = _summary(gpus, host, "found")
        problems = series_tier.differences(self.run_id, expected, found)
        covered = found["gpu_rows"] + found["host_rows"]
        for i, part in enumerate(self.parts):  # days tiered, then dropped from the ledger: the store holds them alone
            in_part = {k: v.parts[i] for k, v in gpus.items() if i in v.parts}
            in_host = host.parts.get(i) if host is not None else None
            got = _summary_of(in_part, in_host)
            lines = series_tier.differences(self.run_id, part, got)
            problems += [f"{line} (tiered {part['day']})" for line in lines]
            covered += got["gpu_rows"] + got["host_rows"]
        whole = _summary(gpus, host, "whole")
        extra = whole["gpu_rows"] + whole["host_rows"] - covered
        if extra > 0 and not problems:
            problems.append(f"run {self.run_id}: the series store holds {extra} rows of it the ledger never held")
        if problems:
            raise CompactError("; ".join(problems))
        # and per day, as a series-only push's seal (LiveSeries.summary): the days the store keeps stay
        # verifiable once its window has dropped the others (store/series_only_verify.py)
        days = {(series_only_verify.HOST if k == HOST else k): v.days for k, v in self.streams.items() if v.days}
        by_day = {k: {d: acc.result() for d, acc in sorted(v.items())} for k, v in sorted(days.items())}
        return {**whole, "days": by_day}


def _summary(gpus: Mapping[str, _Stream], host: _Stream | None, which: str) -> dict[str, Any]:
    """series_tier.day_summary of one kind of the streams' rows (``which``: an attribute)."""
    return _summary_of({k: getattr(v, which) for k, v in gpus.items()}, getattr(host, which) if host else None)


def _summary_of(gpus: Mapping[str, Summing], host: Summing | None) -> dict[str, Any]:
    gpu = {k: v.result() for k, v in sorted(gpus.items()) if v.rows}
    return {
        "gpu_rows": sum(v["rows"] for v in gpu.values()), "host_rows": host.rows if host else 0,
        "gpu": gpu, "host": host.result() if host is not None and host.rows else None,
    }  # fmt: skip
