"""Tiering (docs/SCALE.md, "Tiering"): a day of raw intervals copied into a series store, read
back and checked, before PostgreSQL drops its day partition (store/retention_days.py).

A run's rows of one day go in one ``write()`` with the token ``tier:<YYYY-MM-DD>:<run id>``, so a
retry after a crash stores nothing twice. What the store returns is compared with
``quantum.quantize_*`` of the PostgreSQL rows: per GPU and for the host, the row count, the sums
of the counted columns in the store's integer units and a sha256 over the quantized rows in
(device, seq) order. That summary is the ``run.raw_tiered`` payload, which ``audit verify
--series`` (store/series_verify.py) later checks the store against.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.series import quantum
from gpuledger.series.base import SeriesStore
from gpuledger.store import schema

ACTION = "run.raw_tiered"
# How long a tier store keeps raw rows (store/series_window.py; on ClickHouse also its TTL): tiered
# days are already past the ledger's raw window, so the store's own window must be far longer.
DEFAULT_SERIES_DAYS = 366
GPU_COLUMNS = tuple(c.name for c in schema.gpu_intervals.c if c.name != "run_id")
HOST_COLUMNS = tuple(c.name for c in schema.host_intervals.c if c.name != "run_id")
# Summed column -> (payload name, its scale to the store's integer unit; 1: an exact integer)
GPU_SUMS = {"samples": ("samples", 1), "busy_s": ("busy_ms", 1000), "energy_j": ("energy_mj", 1000)}
HOST_SUMS = {"samples": ("samples", 1), "cpu_s": ("cpu_ms", 1000), "read_b": ("read_b", 1), "write_b": ("write_b", 1)}


class TierError(RuntimeError):
    """The series store does not hold what was copied into it: the day stays in PostgreSQL."""


def shown_url(url: str) -> str:
    """``url`` without its password, as the audit trail and the output name the store."""
    return re.sub(r"//([^:/@]*):[^@/]*@", r"//\1:***@", url)


def open_store(url: str, *, series_days: int = DEFAULT_SERIES_DAYS, create: bool = True) -> SeriesStore:
    """The tier store ``url`` names; ValueError (series.open.BadSeriesUrl) for one gpuledger has not."""
    from gpuledger.series.open import open_series

    store = open_series(url, raw_days=series_days)
    if create:
        try:
            store.create()
        except BaseException:
            store.close()
            raise
    return store


@dataclass
class Tier:
    """Where days go before they are dropped: the open store, its URL as recorded, and the store's
    own window (retention drops its whole days older than that: store/series_window.py)."""

    store: SeriesStore
    url: str  # without the password
    series_days: int = DEFAULT_SERIES_DAYS

    @classmethod
    def open(cls, url: str, *, series_days: int = DEFAULT_SERIES_DAYS, create: bool = True) -> Tier:
        return cls(open_store(url, series_days=series_days, create=create), shown_url(url), series_days)


# -- the summary of rows ---------------------------------------------------------------------------


def _canon(value: Any) -> Any:
    """One spelling per value, whatever type a backend hands back (97 and 97.0 are one value)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < 2**53 else repr(value)
    if isinstance(value, Mapping):
        return {str(k): _canon(v) for k, v in sorted(value.items())}
    return str(value)


def _line(row: Mapping[str, Any], columns: Sequence[str]) -> bytes:
    """A row as the digest hashes it: its values in ``columns`` order, one spelling each."""
    return json.dumps([_canon(row.get(c)) for c in columns], sort_keys=True).encode() + b"\n"


def digest(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(_line(row, columns))
    return h.hexdigest()


Item = tuple[int, bytes, tuple[int | None, ...]]  # a row as Summing adds it: seq, digest line, sums in units


class Summing:
    """``summary`` of rows given a page at a time (in seq order across pages), for a run too long
    to hold whole (store/series_compact_check.py); ``summary`` itself is one page. A row's ``item``
    is made once for all the summaries it goes into."""

    def __init__(self, sums: Mapping[str, tuple[str, int]], columns: Sequence[str]) -> None:
        self.sums, self.columns = sums, columns
        self.names = [name for name, _ in sums.values()]
        self.totals = dict.fromkeys(self.names, 0)
        self.measured = dict.fromkeys(self.names, 0)
        self.rows, self.first, self.last = 0, 0, 0
        self.hash = hashlib.sha256()

    def item(self, r: Mapping[str, Any]) -> Item:
        units = tuple(
            None if r.get(column) is None else quantum.to_units(r[column], scale) if scale != 1 else int(r[column])
            for column, (_, scale) in self.sums.items()
        )
        return int(r["seq"]), _line(r, self.columns), units

    def add(self, rows: Iterable[Mapping[str, Any]]) -> None:
        self.add_items([self.item(r) for r in rows])

    def add_items(self, items: Sequence[Item]) -> None:
        totals, measured, h = self.totals, self.measured, self.hash
        for seq, line, units in items:
            for name, value in zip(self.names, units, strict=True):
                if value is not None:
                    totals[name] += value
                    measured[name] += 1
            self.first, self.last = (seq, seq) if not self.rows else (min(self.first, seq), max(self.last, seq))
            self.rows += 1
            h.update(line)

    def copy(self) -> Summing:
        """A summary of the rows added so far that goes on apart from this one."""
        out = Summing(self.sums, self.columns)
        out.totals, out.measured = dict(self.totals), dict(self.measured)
        out.rows, out.first, out.last, out.hash = self.rows, self.first, self.last, self.hash.copy()
        return out

    def result(self) -> dict[str, Any]:
        return {
            "rows": self.rows, "seq": [self.first, self.last] if self.rows else None, "sums": dict(self.totals),
            "measured": dict(self.measured), "sha256": self.hash.hexdigest(),
        }  # fmt: skip


def summary(rows: Sequence[Mapping[str, Any]], sums: Mapping[str, tuple[str, int]], columns: Sequence[str]) -> dict:  # type: ignore[type-arg]
    """Count, seq range, integer sums, the rows that measured each sum, and digest of quantized
    ``rows`` (already in seq order). ``measured`` keeps an unmeasured column (0 of the rows) from
    reading as a sum of 0 once the rows are gone (store/tiered_totals.py)."""
    out = Summing(sums, columns)
    out.add(rows)
    return out.result()


def day_summary(gpu: Sequence[Mapping[str, Any]], host: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The quantized summary of one run's rows of one day: per GPU, and the host's."""
    by_device: dict[str, list[Mapping[str, Any]]] = {}
    for r in gpu:
        by_device.setdefault(str(r["device_uuid"]), []).append(r)
    return {
        "gpu_rows": len(gpu), "host_rows": len(host),
        "gpu": {d: summary(rows, GPU_SUMS, GPU_COLUMNS) for d, rows in sorted(by_device.items())},
        "host": summary(host, HOST_SUMS, HOST_COLUMNS) if host else None,
    }  # fmt: skip


def run_was_tiered(conn: Connection, run_id: str) -> bool:
    """Whether some raw day of ``run_id`` was tiered (a ``run.raw_tiered`` entry; an index lookup)."""
    a = schema.audit_log.c
    q = sa.select(a.seq).where(a.object == f"run:{run_id}", a.action == ACTION).limit(1)
    return conn.scalar(q) is not None


def tiered_days(conn: Connection, run_id: str) -> list[str]:
    """The days (YYYY-MM-DD) of ``run_id`` tiered into a series store, oldest first: the store holds
    no row of the run on another day that the ledger does not hold too."""
    a = schema.audit_log.c
    q = sa.select(a.payload).where(a.object == f"run:{run_id}", a.action == ACTION)
    return sorted({json.loads(p)["day"] for p in conn.scalars(q)})


# -- copying and checking --------------------------------------------------------------------------


def _in(seq_range: Sequence[int] | None, seq: int) -> bool:
    return seq_range is not None and seq_range[0] <= seq <= seq_range[1]


def stored_summary(store: SeriesStore, run_id: str, expected: Mapping[str, Any]) -> dict[str, Any]:
    """What ``store`` now holds of the rows ``expected`` (a day_summary) describes: per GPU the rows
    in its seq range, the host's in its range."""
    ranges = {d: s["seq"] for d, s in expected["gpu"].items()}
    gpu = [r for r in store.gpu_intervals(run_id) if _in(ranges.get(str(r["device_uuid"])), int(r["seq"]))]
    host_range = expected["host"]["seq"] if expected.get("host") else None
    host = [r for r in store.host_intervals(run_id) if _in(host_range, int(r["seq"]))] if host_range else []
    gpu.sort(key=lambda r: (str(r["device_uuid"]), int(r["seq"])))
    host.sort(key=lambda r: int(r["seq"]))
    return day_summary(gpu, host)


def differences(run_id: str, expected: Mapping[str, Any], found: Mapping[str, Any]) -> list[str]:
    """One line per GPU (and the host) whose rows in the store differ from those tiered."""
    out = []
    parts = [(f"GPU {d}", s, found["gpu"].get(d)) for d, s in expected["gpu"].items()]
    if expected.get("host"):
        parts.append(("host", expected["host"], found.get("host")))
    for what, want, got in parts:
        if got is not None:  # a payload tiered before a key was added is compared on its own keys
            got = {k: v for k, v in got.items() if k in want}
        if got == want:
            continue
        lo, hi = want["seq"]
        out.append(f"run {run_id} {what} seq {lo}-{hi}: {why_differs(want, got)}")
    return out


def why_differs(want: Mapping[str, Any], got: Mapping[str, Any] | None, recorded: str = "tiered") -> str:
    """Why a summary the store gives (``got``: rows, sums, sha256; None: nothing) differs from
    the one ``recorded`` in the trail (``want``), in the words every verify line uses."""
    if got is None:
        return "missing from the series store"
    if got["rows"] != want["rows"]:
        return f"{got['rows']} rows in the series store, {want['rows']} {recorded}"
    if got["sums"] != want["sums"]:
        changed = [k for k in want["sums"] if want["sums"][k] != got["sums"].get(k)]
        return f"sums of {', '.join(changed)} differ from those {recorded}"
    return f"rows changed (sha256 differs from the one {recorded})"


def rollup_differences(store: SeriesStore, run_id: str, expected: Mapping[str, Any], day: str) -> list[str]:
    """On ClickHouse, whose rollups (what chargeback reads) are written by views after the raw
    rows: one line per rollup of the run's GPUs in ``expected`` on ``day`` (YYYY-MM-DD) short of
    the raw rows the store holds (``ClickHouseSeries.short_rollups``: per GPU one GROUP BY of its
    raw rows through the view's SELECT); [] for a store whose sums are read from its rows."""
    short = getattr(store, "short_rollups", None)
    if short is None or not expected["gpu"]:
        return []
    lines = short(run_id, sorted(expected["gpu"]), datetime.date.fromisoformat(day))
    return [f"run {run_id} {line}" for line in lines]


def day_rows(conn: Connection, names: Sequence[tuple[str, bool]]) -> dict[str, tuple[list[dict], list[dict]]]:  # type: ignore[type-arg]
    """Each run's GPU and host rows held in these day partitions (name, is gpu), in seq order."""
    out: dict[str, tuple[list[dict], list[dict]]] = {}  # type: ignore[type-arg]
    for name, gpu in names:
        table = schema.gpu_intervals if gpu else schema.host_intervals
        q = sa.select(table).where(sa.text(f"tableoid = '{name}'::regclass"))
        order = (table.c.run_id, table.c.device_uuid, table.c.seq) if gpu else (table.c.run_id, table.c.seq)
        for r in conn.execute(q.order_by(*order)).mappings():
            row = {k: v for k, v in r.items() if k != "run_id"}
            out.setdefault(r["run_id"], ([], []))[0 if gpu else 1].append(row)
    return out


def copy_run(tier: Tier, date: str, run_id: str, gpu: list[dict], host: list[dict]) -> dict[str, Any]:  # type: ignore[type-arg]
    """Copy one run's rows of ``date`` into the store and read them back: the ``run.raw_tiered``
    payload; TierError when the store does not hold exactly their quantized values."""
    expected = day_summary([quantum.quantize_gpu(r) for r in gpu], [quantum.quantize_host(r) for r in host])
    written = tier.store.write(run_id, gpu, host, token=f"tier:{date}:{run_id}")
    problems = differences(run_id, expected, stored_summary(tier.store, run_id, expected))
    problems = problems or rollup_differences(tier.store, run_id, expected, date)  # rows as copied: their rollups
    if problems:
        raise TierError("; ".join(problems))
    return {"day": date, "series": tier.url, "written": written, **expected}
