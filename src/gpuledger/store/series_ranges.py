"""A stream's time buckets found as seq ranges, so each is summed in index order (SQLite).

A GROUP BY on the bucket of t0 makes SQLite sort every row of the stream (a 72-hour GPU stream
has 259,200) before it aggregates. A stream's intervals follow each other in seq order, so each
bucket is a run of consecutive seqs: ``walk`` asks for one bucket at a time, ``[a, a + width)``
less the rows of later buckets (``t0 < edge``), and the answer's own count, last seq and least t0
prove that the range holds exactly that bucket's rows. A stream that is not in time order, or
has a hole in its seqs, fails the proof: ``walk`` says None and the caller groups instead.

Why that proves it: each range ``[a, last]`` is contiguous (count == last - a + 1), every row in
it is before the next edge (the filter) and at or after its own edge (the least t0), and the rows
left out after ``last`` are past the next edge. Ranges follow each other from the stream's first
seq to its last with bucket keys strictly increasing, so every row is in exactly one range, and
that range is its bucket's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

Query = Callable[[int, int, float], Sequence[Any]]  # (a, b, edge) -> (n, last seq, least t0, ...)
Probe = Callable[[int], float | None]  # seq -> its t0, None when there is no such row


class Buckets:
    """The bucket of a t0, as SQL's ``CAST((t0 - origin) / width AS INTEGER)`` and
    ``core.metering.series.Plan.key`` compute it, and each bucket's first t0 as a float bound."""

    def __init__(self, origin: float, width: float) -> None:
        self.origin = origin
        self.width = width

    def key(self, t0: float) -> int:
        return max(0, math.floor((t0 - self.origin) / self.width))

    def edge(self, key: int) -> float:
        """The least float t0 whose key is ``key`` or more: ``t0 < edge(k + 1)`` is exactly
        ``key(t0) <= k``, one comparison per row instead of the key's arithmetic."""
        t = self.origin + key * self.width
        while self.key(t) >= key:  # the product may round either way: step to the exact bound
            t = math.nextafter(t, -math.inf)
        while self.key(t) < key:
            t = math.nextafter(t, math.inf)
        return t


def walk(
    query: Query, probe: Probe, buckets: Buckets, lo: int, hi: int, guess: int
) -> list[tuple[int, int, Any]] | None:
    """Each bucket of the stream with seqs ``lo..hi``: ``(key, first seq, row)`` in time order,
    ``row`` being ``query``'s answer for the bucket's range; None when the stream cannot be cut so.
    ``guess``: rows a bucket is expected to hold (asked for with some room; doubled when short)."""
    t0 = probe(lo)
    if t0 is None:
        return None
    k = buckets.key(t0)
    width = max(1, guess)
    out: list[tuple[int, int, Any]] = []
    a = lo
    while a <= hi:
        b = min(a + width, hi + 1)
        row = query(a, b, buckets.edge(k + 1))
        n, last, least = row[0], row[1], row[2]
        if not n:  # the row at a is in a later bucket (the recorder paused): go to that one
            t0 = probe(a)
            if t0 is None or buckets.key(t0) <= k:
                return None
            k = buckets.key(t0)
            continue
        if buckets.key(least) != k or n != last - a + 1:
            return None  # out of time order, or a hole in the seqs
        if last == b - 1 and b <= hi:  # the bucket may go on past the rows asked for
            width *= 2
            continue
        out.append((k, a, row))
        a, k = last + 1, k + 1
        width = n + n // 8 + 4
    return out


def stream(
    cur: Any, sql: str, table: str, where: str, params: tuple[Any, ...], plan: Any
) -> list[tuple[int, int, Any]] | None:
    """``walk`` over one stream of ``table`` (``where``: its rows, ``?`` placeholders for
    ``params``) on a DBAPI cursor; ``sql`` answers ``(n, last seq, least t0, ...)`` for ``params``
    then a, b and edge. None for an empty stream too. Positional parameters: the walk runs a
    query per bucket (16,000 for 8 GPUs), and binding by name costs a third more per query."""
    # One lone min() or max() per statement: SQLite answers each from the index.
    lo = cur.execute(f"SELECT min(seq) FROM {table} WHERE {where}", params).fetchone()[0]
    hi = cur.execute(f"SELECT max(seq) FROM {table} WHERE {where}", params).fetchone()[0]
    if lo is None or plan.width_s is None:
        return None
    probe_sql = f"SELECT t0 FROM {table} WHERE {where} AND seq = ?"

    def probe(seq: int) -> float | None:
        row = cur.execute(probe_sql, (*params, seq)).fetchone()
        return None if row is None else float(row[0])

    def query(a: int, b: int, edge: float) -> Sequence[Any]:
        return cur.execute(sql, (*params, a, b, edge)).fetchone()

    first, last = probe(lo), probe(hi)
    if first is None or last is None:
        return None
    guess = (hi - lo) * plan.width_s / (last - first) if last > first else hi - lo + 1
    return walk(query, probe, Buckets(plan.origin, plan.width_s), lo, hi, math.ceil(guess) + 1)
