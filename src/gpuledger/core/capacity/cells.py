"""The capacity report's cells (core/capacity/report.py) and their pricing. A cell is one GPU's
time on one day and host: its four states and the time it was in the fleet unobserved, in
milliseconds. Each becomes micro-GPU-hours once (largest remainder: its parts add up to its hours);
hours are summed per group and price line and priced once at the end (cost is linear in the
integers: the same units as pricing every cell). Whole cells of one price are turned into hours
column-wise (core/capacity/columnar.py); a cell in which the price changes is cut there in
proportion to time, piece by piece, as is every cell when a caller wants each piece (``on_piece``).
Pure.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from gpuledger.core.capacity.columnar import cells_to_uh, sums_by_slot
from gpuledger.core.capacity.model import DAY_MS, FleetGpu, apportion, ms, to_uh
from gpuledger.core.capacity.pools import Pools
from gpuledger.core.capacity.totals import CapacityTotals
from gpuledger.core.chargeback.totals import hours
from gpuledger.core.money import gpu_money, joules_to_mwh
from gpuledger.core.pricing.ratecard import RateCard, RateLine

__all__ = ["CellPricer", "cells"]


class Pricing:
    """Rate lines by (model, instance type, day), with the times a price changes within the day."""

    def __init__(self, card: RateCard) -> None:
        self.card = card
        self._models: dict[str, str] = {}
        self._lines: dict[tuple[str, str | None, int], tuple[RateLine | None, list[int]]] = {}

    def model(self, name: str) -> str:
        key = self._models.get(name)
        if key is None:
            key = self._models[name] = self.card.models.match(name) or name
        return key

    def on_day(self, model: str, instance: str | None, day: int) -> tuple[RateLine | None, list[int]]:
        """(the line at the day's start, change times inside the day in ms)."""
        key = (model, instance, day)
        found = self._lines.get(key)
        if found is None:
            a, b = day * DAY_MS / 1000, (day + 1) * DAY_MS / 1000
            cuts = [ms(t) for t in self.card.cuts(model, instance, a, b)]
            found = self._lines[key] = (self.card.line_at(model, instance, a), cuts)
        return found


def _add_priced(acc: CapacityTotals, line: RateLine | None, uh: Sequence[int], unmeasured: int, mwh: int) -> None:
    acc.unallocated_uh += uh[0]
    acc.alloc_idle_uh += uh[1]
    acc.busy_attr_uh += uh[2]
    acc.busy_unattr_uh += uh[3]
    acc.unobserved_uh += uh[4]
    acc.unmeasured_uh += unmeasured
    if line is None:
        acc.unpriced_uh += sum(uh)
        acc.energy += mwh * 1000
        return
    rate = line.rate_u
    acc.unallocated_cost += gpu_money(uh[0], rate)
    acc.alloc_idle_cost += gpu_money(uh[1], rate)
    acc.busy_attr_cost += gpu_money(uh[2], rate)
    acc.busy_unattr_cost += gpu_money(uh[3], rate)
    acc.unobserved_cost += gpu_money(uh[4], rate)
    units = mwh * line.pue_m
    acc.energy += units
    acc.energy_cost += units * line.energy_u


def _pieces(parts: list[int], lengths: list[int]) -> list[list[int]]:
    """``parts`` split into pieces of the given relative ``lengths``: each piece's total in
    proportion to its length, each part handed out piece by piece among what is left, so the
    pieces add up to every part exactly."""
    totals = apportion(sum(parts), lengths)
    left = list(parts)
    out = []
    for n, total in enumerate(totals):
        piece = list(left) if n == len(totals) - 1 else apportion(total, left)
        out.append(piece)
        left = [a - b for a, b in zip(left, piece, strict=True)]
    return out


# A cell: one GPU's time on one day and host: [unallocated, alloc_idle, busy_attr, busy_unattr,
# unobserved, unmeasured] ms, energy J, first ms, last ms, whether energy was measured.
_Cell = list[Any]


def cells(
    gpu: FleetGpu, rows_by_day: Mapping[int, list[Sequence[Any]]], start_ms: int, end_ms: int
) -> Iterator[tuple[str, int, _Cell]]:
    """The GPU's cells in the window: its day rows per host, and the time it was in the fleet but
    not observed, put on the host it was seen on most that day (else the host it was on then)."""
    p0, p1 = max(ms(gpu.first_seen), start_ms), min(ms(gpu.last_seen), end_ms)
    days = set(rows_by_day)
    if p1 > p0:
        days.update(range(p0 // DAY_MS, (p1 - 1) // DAY_MS + 1))
    stays = sorted(gpu.hosts, key=lambda h: h.first_seen)
    for day in sorted(days):
        d0 = day * DAY_MS
        a, b = max(p0, d0), min(p1, d0 + DAY_MS)
        rows = rows_by_day.get(day, ())
        if len(rows) == 1:  # the common case: one host all day
            r = rows[0]
            unobserved = max(0, b - a) - (r[5] + r[6] + r[7] + r[8])
            energy = r[10]
            cell = [r[5], r[6], r[7], r[8], 0, r[9], energy or 0.0, r[3], r[4], energy is not None]
            if unobserved > 0:
                cell[4], cell[7], cell[8] = unobserved, min(r[3], a), max(r[4], b)
            yield r[2], day, cell
            continue
        per_host: dict[str, _Cell] = {}
        for r in rows:
            cell = per_host.setdefault(r[2], [0, 0, 0, 0, 0, 0, 0.0, r[3], r[4], False])
            for i in range(4):
                cell[i] += r[5 + i]
            cell[5] += r[9]
            if r[10] is not None:
                cell[6] += r[10]
                cell[9] = True
            cell[7], cell[8] = min(cell[7], r[3]), max(cell[8], r[4])
        observed = sum(c[0] + c[1] + c[2] + c[3] for c in per_host.values())
        unobserved = max(0, b - a) - observed
        yield from ((host, day, cell) for host, cell in per_host.items())
        if unobserved > 0:
            # A cell of its own, over the time no host observed: stretched over a host's cell, it
            # would move that host's hours across a price change the host never saw.
            # the host that observed it most that day (a tie goes to the first name: whatever order
            # the database handed the rows in, the report is the same)
            seen = {h: (-sum(c[:4]), h) for h, c in per_host.items()}
            host = min(seen, key=seen.__getitem__) if per_host else _host_on(gpu, stays, d0)
            lo, hi = _unobserved_span(a, b, [(c[7], c[8]) for c in per_host.values()])
            yield host, day, [0, 0, 0, 0, unobserved, 0, 0.0, lo, hi, False]


class CellPricer:
    """Cells into the groups' exact sums: hours once per cell, summed per group and price line,
    priced once per (group, line) at the end (``finish``): cost is linear in the integers, so this
    is the same to the unit as pricing every cell, and a year of a large fleet stays fast."""

    def __init__(
        self, card: RateCard, pools: Pools, by: Sequence[str], on_piece: Callable[[tuple[Any, ...]], None] | None
    ) -> None:
        self.card, self.pools, self.by, self.on_piece = card, pools, tuple(by), on_piece
        self.pricing = Pricing(card)
        self.groups: dict[tuple[Any, ...], CapacityTotals] = {}
        self.unknown_models: set[str] = set()
        self.unpriced: set[str] = set()
        self._context: dict[tuple[str, str], tuple[str, str | None, str, tuple[Any, ...]]] = {}
        # (group key, id of the line) -> [5 state µh, unmeasured µh, energy mWh] (a line is one object)
        self._sums: dict[tuple[tuple[Any, ...], int], list[int]] = {}
        self._lines: dict[int, RateLine | None] = {}
        # Whole cells of one price, turned into µh column-wise at the end (core/capacity/columnar.py):
        # their slot (group and line), 5 parts and unmeasured ms, energy J, energy measured
        self._slots: dict[tuple[tuple[Any, ...], int], int] = {}
        self._slot_of: list[tuple[tuple[Any, ...], int]] = []
        self._cells: list[list[Any]] = [[] for _ in range(9)]

    def _of(self, gpu: FleetGpu, host: str) -> tuple[str, str | None, str, tuple[Any, ...]]:
        """(model, instance type, pool, group key) of a GPU on a host, worked out once."""
        found = self._context.get((gpu.uuid, host))
        if found is None:
            model = self.pricing.model(gpu.name)
            if model == gpu.name and self.card.models.match(gpu.name) is None:
                self.unknown_models.add(gpu.name)
            instance = self.pools.instance_type(host, gpu.instance_on(host))
            pool = self.pools.name(host, instance, model)
            key = _key(self.by, host, model, pool, gpu.uuid)
            totals = self.groups.get(key)
            if totals is None:
                totals = self.groups[key] = CapacityTotals()
            totals.gpus.add(gpu.uuid)
            found = self._context[(gpu.uuid, host)] = (model, instance, pool, key)
        return found

    def add(self, gpu: FleetGpu, host: str, day: int, cell: _Cell) -> None:
        model, instance, pool, key = self._of(gpu, host)
        line, cuts = self.pricing.on_day(model, instance, day)
        inside = [c for c in cuts if cell[7] < c < cell[8]] if cuts else cuts
        if cuts and not inside:  # the price changes that day, but not while the cell lasts: its own price
            line = self.card.line_at(model, instance, cell[7] / 1000)
        if self.on_piece is None and not inside:
            self._later(key, line, cell, model, instance)
            return
        uh = to_uh(cell[:5])
        unmeasured = to_uh([cell[5], max(0, sum(cell[:5]) - cell[5])])[0] if cell[5] else 0
        mwh = joules_to_mwh(cell[6]) if cell[9] else 0
        where = (gpu.uuid, host, day, pool, model, instance)
        if not inside:
            self._add(key, line, uh, unmeasured, mwh, where, cell[7])
            return
        edges = [cell[7], *inside, cell[8]]
        lengths = [b - a for a, b in itertools.pairwise(edges)]
        for a, piece in zip(edges, _pieces([*uh, unmeasured, mwh], lengths), strict=False):
            line = self.card.line_at(model, instance, a / 1000)
            self._add(key, line, piece[:5], piece[5], piece[6], where, a)

    def _add(self, key: tuple[Any, ...], line: RateLine | None, uh: Sequence[int], unmeasured: int, mwh: int,
             where: tuple[Any, ...], t0_ms: int) -> None:  # fmt: skip
        acc = self._sums.get((key, id(line)))
        if acc is None:
            acc = self._sums[(key, id(line))] = [0, 0, 0, 0, 0, 0, 0]
            self._lines[id(line)] = line
            if line is None:
                self.unpriced.add(where[4] + (f" on {where[5]}" if where[5] else ""))
        acc[0] += uh[0]
        acc[1] += uh[1]
        acc[2] += uh[2]
        acc[3] += uh[3]
        acc[4] += uh[4]
        acc[5] += unmeasured
        acc[6] += mwh
        if self.on_piece is not None:
            self.on_piece((*where, line, tuple(uh), unmeasured, mwh, t0_ms / 1000))

    def _later(
        self, key: tuple[Any, ...], line: RateLine | None, cell: _Cell, model: str, instance: str | None
    ) -> None:
        slot = self._slots.get((key, id(line)))
        if slot is None:
            slot = self._slots[(key, id(line))] = len(self._slot_of)
            self._slot_of.append((key, id(line)))
            self._sums.setdefault((key, id(line)), [0, 0, 0, 0, 0, 0, 0])
            self._lines[id(line)] = line
            if line is None:
                self.unpriced.add(model + (f" on {instance}" if instance else ""))
        columns = self._cells
        columns[0].append(slot)
        for i in range(6):
            columns[i + 1].append(cell[i])
        columns[7].append(cell[6])
        columns[8].append(cell[9])

    def finish(self) -> dict[tuple[Any, ...], CapacityTotals]:
        """The groups' totals: each (group, line)'s summed integers priced once."""
        if self._cells[0]:
            c = self._cells
            parts = np.array(c[1:6], dtype=np.int64).T
            uh, unmeasured, mwh = cells_to_uh(parts, np.array(c[6], dtype=np.int64), np.array(c[7], dtype=np.float64),
                                              np.array(c[8], dtype=bool))  # fmt: skip
            sums = sums_by_slot(np.array(c[0], dtype=np.int64), [*uh.T, unmeasured, mwh])
            for slot, v in sums.items():
                acc = self._sums[self._slot_of[slot]]
                for i, x in enumerate(v):
                    acc[i] += x
            self._cells = [[] for _ in range(9)]
        for (key, line_id), v in self._sums.items():
            _add_priced(self.groups[key], self._lines[line_id], v[:5], v[5], v[6])
        self._sums = {}
        return self.groups

    def notes(self, total: CapacityTotals) -> list[str]:
        out = []
        if self.unknown_models:
            out.append(f"GPU models not in the normalisation table: {', '.join(sorted(self.unknown_models))} "
                       "(priced only by an [[instance]] line or an [aliases] entry; docs/RATE_CARDS.md)")  # fmt: skip
        if self.unpriced:
            out.append(f"no rate for {', '.join(sorted(self.unpriced))}: "
                       f"{hours(total.unpriced_uh):,.2f} GPU-h in no cost")  # fmt: skip
        if total.unobserved_uh:
            out.append(f"{hours(total.unobserved_uh):,.2f} GPU-h of the fleet were not observed (no agent running "
                       "on their host): priced in the fleet cost, their state unknown")  # fmt: skip
        return out


def _unobserved_span(a: int, b: int, observed: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The first and last instant of [a, b) outside every observed (first, last) span; (a, b) when
    the day's unobserved time lies inside them (a gap a host's day sums cannot place)."""
    lo = hi = None
    t = a
    for s0, s1 in sorted(observed):
        if s0 > t:
            lo = t if lo is None else lo
            hi = min(s0, b)
        t = max(t, s1)
        if t >= b:
            break
    if t < b:
        lo = t if lo is None else lo
        hi = b
    return (a, b) if lo is None or hi is None or hi <= lo else (lo, hi)


def _host_on(gpu: FleetGpu, stays: Sequence[Any], t_ms: int) -> str:
    """The host a GPU was on at ``t_ms`` by its stays: the latest stay begun by then, else its first."""
    if not stays:
        return gpu.host
    starts = [ms(s.first_seen) for s in stays]
    i = bisect.bisect_right(starts, t_ms) - 1
    return str(stays[max(0, i)].host)


def _key(by: Sequence[str], host: str, model: str, pool: str, uuid: str) -> tuple[Any, ...]:
    values = {"host": host, "gpu_model": model, "pool": pool, "gpu": uuid}
    return tuple(values[k] for k in by)
