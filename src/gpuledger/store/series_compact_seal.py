"""Whether a run's rows still match its seal, its interval rows read a page at a time: the check
``db migrate --layout compact`` (store/series_compact.py) makes before it moves a run, without the
whole run in memory (store/audit_seals.current_seal holds every row of it).

Each interval series is sealed as core/audit/seal.seal_series seals it (the rows in seq order, one
hash per chunk of rows, chunk = ceil(rows / MAX_HASHES) from the series' row count, counted first;
its sums exactly rounded, as ``math.fsum``, from exact integer sums), the rest of the seal as
before. Equal to the latest seal: the run may move. Otherwise retention's check (``tampered``)
names what changed, reading the run whole as it always did: only for a run that does not move.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.audit import seal as seals
from gpuledger.store import audit, audit_seals, schema
from gpuledger.store import series_compact_read as pages

_SCALE = 1074  # 2**-1074: the smallest float step; every finite float is an integer multiple of it


class _Inexact(Exception):
    """A value an exact integer sum cannot hold (NaN, infinity): the seal is computed as before."""


class _ExactSum:
    """``math.fsum`` of values given a page at a time: their exact sum as an integer multiple of
    2**-1074, rounded to a float once at the end (fsum is exactly rounded too)."""

    def __init__(self) -> None:
        self.total, self.known = 0, False

    def add(self, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, float) and not math.isfinite(value):
            raise _Inexact(value)
        num, den = value.as_integer_ratio()
        self.total += num * ((1 << _SCALE) // den)
        self.known = True

    def result(self) -> float | None:
        return float(Fraction(self.total, 1 << _SCALE)) if self.known else None


class SeriesSeal:
    """``seal_series`` of one series' rows, given in seq order a page at a time; ``n``: their count."""

    def __init__(self, n: int, sums: Sequence[str], table: str) -> None:
        self.table, self.chunk = table, max(1, math.ceil(n / seals.MAX_HASHES))
        self.rows, self.hashes, self.seqs = 0, [], []  # type: ignore[var-annotated]
        self.pending: list[dict[str, Any]] = []
        self.sums = {k: _ExactSum() for k in sums}

    def add(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for r in rows:
            self.pending.append(seals.sealed_row(self.table, r))
            if len(self.pending) == self.chunk:
                self.hashes.append(seals.chunk_hash(self.pending))
                self.pending = []
            seq = int(r["seq"])
            if self.seqs and seq == self.seqs[-1][1] + 1:
                self.seqs[-1][1] = seq
            else:
                self.seqs.append([seq, seq])
            for k, acc in self.sums.items():
                acc.add(r.get(k))
            self.rows += 1

    def result(self) -> dict[str, Any]:
        hashes = [*self.hashes, seals.chunk_hash(self.pending)] if self.pending else self.hashes
        return {
            "n": self.rows, "seqs": self.seqs, "sums": {k: acc.result() for k, acc in self.sums.items()},
            "chunk": self.chunk, "hashes": hashes,
        }  # fmt: skip


def _counts(conn: Connection, run_id: str) -> dict[str, int]:
    """Rows per series name (``gpu_intervals/<uuid>``, ``host_intervals``), counted on the key."""
    g, h = schema.gpu_intervals.c, schema.host_intervals.c
    q = sa.select(g.device_uuid, sa.func.count()).where(g.run_id == run_id).group_by(g.device_uuid)
    out = {f"gpu_intervals/{uuid}": int(n) for uuid, n in conn.execute(q)}
    host = int(conn.scalar(sa.select(sa.func.count()).where(h.run_id == run_id)) or 0)
    return out | ({"host_intervals": host} if host else {})


def seal_now(conn: Connection, run_id: str, limit: int) -> dict[str, Any] | None:
    """The run's seal computed from its rows now, the interval rows ``limit`` at a time; None
    when the run is gone, or a value only the whole-run seal spells (NaN, infinity)."""
    found = audit_seals.current_seal(conn, run_id, intervals=False)
    if found is None:
        return None
    digest = dict(found[0])
    series: dict[str, Any] = {}
    try:
        for name, n in sorted(_counts(conn, run_id).items()):
            if name == "host_intervals":
                acc = SeriesSeal(n, seals.HOST_SUMS, "host_intervals")
                read = pages.ledger_host_pages(conn, run_id, limit)
            else:
                acc = SeriesSeal(n, seals.GPU_SUMS, "gpu_intervals")
                read = pages.ledger_gpu_pages(conn, run_id, name.split("/", 1)[1], limit)
            for page in read:
                acc.add(page)
            series[name] = acc.result()
    except _Inexact:
        return None
    return {**digest, "series": series}


def unchanged(conn: Connection, run_id: str, limit: int) -> bool:
    """Whether the run's rows are those its latest seal sealed (False when never sealed)."""
    sealed = audit.latest_seal(conn, run_id)
    return sealed is not None and seal_now(conn, run_id, limit) == sealed
