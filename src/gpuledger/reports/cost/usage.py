"""From the ledger to ``Usage``: what each run used of each GPU, per UTC day, ready to price.

Two sources, one meaning (core/pricing/usage.py):
- ``gpu_rollups`` rows (migration 2: per run, GPU model and UTC day), written for finished runs by
  ``materialise_rollups``; read as they are (a plain scan beats a GROUP BY) and priced in one pass
  (``Pricer.price_rollups``), so a year of a large cluster stays within seconds;
- the GPU intervals of runs without rollups, summed in SQL per run, GPU and day. A GPU that
  several runs held at once is split in Python from the raw intervals (core/pricing/share.py).
Windows are widened to whole UTC days here; the pricer cuts at the exact window edges.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import operator
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from gpuledger.core.pricing.cost import Usage
from gpuledger.core.pricing.share import Reading, Tenant, attribute, overlapping_groups
from gpuledger.core.pricing.usage import DAY_S, DayUsage, day_of, days_from_segments, held_span, period_of, split_days
from gpuledger.store import cost_queries as cq
from gpuledger.store import series_day_sums

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from gpuledger.store import Ledger
    from gpuledger.store.series_cut_days import CutDays

T = TypeVar("T")

__all__ = ["RunRow", "Scope", "UsageSet", "collect_report", "collect_runs", "interval_day_usage", "read"]

Scope = cq.Scope


def read(ledger: Ledger, fn: Callable[[Connection], T]) -> T:
    """Run ``fn`` in one read transaction of the ledger (one consistent snapshot on SQLite)."""
    return ledger.read(fn)


class RunRow(NamedTuple):
    """A run as the cost reports need it (it serves as core.chargeback.report.RunInfo too). A tuple:
    a report makes one per run, hundreds of thousands for a year."""

    id: str
    status: str
    user: str
    team: str | None
    project: str | None
    name: str | None
    started_at: float
    ended_at: float | None
    attempt_of: str | None
    instance_type: str | None = None
    logical_id: str = ""
    replayed: bool = False  # metered from a replayed GPU trace (--replay-gpus): a demo, not billed by default


def _run_rows(
    rows: Sequence[tuple[Any, ...]], instances: dict[str, str], override: str | None = None
) -> dict[str, RunRow]:
    """RunRows from cost_queries.run_rows tuples (already in RunRow's order, with no instance
    type and the run's own id as logical id), given ``instances`` (run id -> instance type) or
    one ``override`` for all. Made in C (a year's report makes half a million)."""
    make = functools.partial(tuple.__new__, RunRow)
    out = dict(zip(map(operator.itemgetter(0), rows), map(make, rows), strict=True))
    if override:
        return {rid: run._replace(instance_type=override) for rid, run in out.items()}
    for rid in instances.keys() & out.keys():
        out[rid] = out[rid]._replace(instance_type=instances[rid])
    return out


@dataclass
class UsageSet:
    """What a report prices: the runs, Usages read from intervals (priced one by one), the rollup
    rows of the window (``rollups``, priced by ``Pricer.price_rollups``) and, for the months shown
    only as a trend, rollup sums per group (``groups``, priced by ``Pricer.price_sums``)."""

    runs: dict[str, RunRow]
    usages: list[Usage]
    devices: dict[tuple[str, str], dict[str, Any]]
    rollups: list[tuple[Any, ...]] = field(default_factory=list)  # cost_queries.rollup_days rows
    period_of_day: dict[int, int] = field(default_factory=dict)
    periods: list[tuple[float, bool]] = field(default_factory=list)
    # (*group key values, instance_type, gpu_name, mig_profile, period, t0, t1, alloc_s, busy_s,
    # energy_j, share_rule)
    groups: list[tuple[Any, ...]] = field(default_factory=list)


def _day_window(start: float | None, end: float | None) -> tuple[float | None, float | None]:
    lo = None if start is None else math.floor(start / DAY_S) * DAY_S
    hi = None if end is None else math.ceil(end / DAY_S) * DAY_S
    return lo, hi


def _clip(span: tuple[float, float], start: float | None, end: float | None) -> tuple[float, float]:
    a = span[0] if start is None else max(span[0], start)
    b = span[1] if end is None else min(span[1], end)
    return a, max(a, b)


def interval_day_usage(
    conn: Connection,
    rows: Sequence[RunRow],
    start: float | None,
    end: float | None,
    cuts: Sequence[float] = (),
    intervals: Sequence[dict[str, Any]] | None = None,
    series: CutDays | None = None,
) -> tuple[list[DayUsage], dict[tuple[str, str], dict[str, Any]]]:
    """Day rows of ``rows`` (runs read from their intervals) inside [start, end), whole days.
    ``cuts``: times inside a day (price changes) where rows are split too, exactly: the intervals
    of those days are read one by one instead of summed in SQL. ``intervals``: the runs' GPU
    intervals already read (run_id, device_uuid, t0, t1, busy_s, energy_j; the whole runs, for
    runs whose raw days were tiered and dropped: ``Ledger.tiered``), summed here instead.
    ``series``: where a series-only run's days with a cut are read from (store/series_cut_days.py)."""
    start, end = _day_window(start, end)
    cut_list = sorted({c for c in cuts if c % DAY_S})
    cut_days = sorted({day_of(c) for c in cut_list})
    ids = [r.id for r in rows]
    devices = {(d["run_id"], d["uuid"]): d for d in cq.device_rows(conn, ids)}
    if intervals is None:
        day_rows, raw_rows = cq.interval_sums(conn, ids, start, end, cut_days, series)
    else:
        day_rows, raw_rows = [], [iv for iv in intervals if _inside(iv, start, end)]
    if start is None and end is None:  # every interval was read: their last end is among them
        last = cq.last_interval_ends(conn, ids, intervals=False)
        for row in itertools.chain(day_rows, raw_rows):
            last[row["run_id"]] = max(last.get(row["run_id"], row["t1"]), row["t1"])
    else:
        last = cq.last_interval_ends(conn, ids)
    spans = {r.id: _clip(held_span(r.status, r.started_at, r.ended_at, last.get(r.id)), start, end) for r in rows}
    sums: dict[tuple[str, str], dict[tuple[int, int], dict[str, Any]]] = {}
    for s in day_rows:
        key = (s["day"], bisect.bisect_right(cut_list, (s["day"] + 0.5) * DAY_S))
        sums.setdefault((s["run_id"], s["device_uuid"]), {})[key] = s
    for iv in raw_rows:
        _add_raw(sums.setdefault((iv["run_id"], iv["device_uuid"]), {}), iv, cut_list)
    for key in sums:  # intervals of a GPU missing from the devices table still count
        devices.setdefault(key, {"run_id": key[0], "uuid": key[1], "index": None, "name": None, "mig_profile": None})
    shared = _shared_days(conn, ids, spans, start, end, cut_list)
    out: list[DayUsage] = []
    for run_id, uuid in sorted(devices):
        if (run_id, uuid) in shared:
            rows_ = shared[(run_id, uuid)]
        else:
            rows_ = _solo_days(run_id, uuid, spans[run_id], sums.get((run_id, uuid), {}), cut_list)
        for d in rows_:
            d.gpu_name, d.mig_profile = devices[(run_id, uuid)].get("name"), devices[(run_id, uuid)].get("mig_profile")
        out.extend(rows_)
    return out, devices


def _inside(iv: dict[str, Any], start: float | None, end: float | None) -> bool:
    return (start is None or iv["t1"] > start) and (end is None or iv["t0"] < end)


def _add_raw(periods: dict[tuple[int, int], dict[str, Any]], iv: dict[str, Any], cuts: Sequence[float]) -> None:
    length = iv["t1"] - iv["t0"]
    pieces = split_days(iv["t0"], iv["t1"], cuts) if length > 0 else [(day_of(iv["t0"]), iv["t0"], iv["t1"])]
    for _day, a, b in pieces:
        share = (b - a) / length if length > 0 else 1.0
        row = periods.setdefault(
            period_of(a, b, cuts),
            {"t0": a, "t1": b, "busy_s": None, "busy_n": 0, "energy_j": None, "energy_n": 0, "intervals": 0},
        )
        row["t0"], row["t1"] = min(row["t0"], a), max(row["t1"], b)
        for col, count in (("busy_s", "busy_n"), ("energy_j", "energy_n")):
            if iv[col] is not None:
                row[col] = (row[col] or 0.0) + iv[col] * share
                row[count] += 1
        row["intervals"] += int(b == iv["t1"] and iv.get("ends", True))  # a row clipped to its day may not


def _solo_days(
    run_id: str,
    uuid: str,
    span: tuple[float, float],
    sums: dict[tuple[int, int], dict[str, Any]],
    cuts: Sequence[float],
) -> list[DayUsage]:
    measured = any(s["busy_n"] for s in sums.values())
    energy_known = any(s["energy_n"] for s in sums.values())
    s, e = span
    if e <= s:
        return []
    out = []
    for day, a, b in split_days(s, e, cuts):
        row = sums.get(period_of(a, b, cuts))
        busy = (row["busy_s"] if row and row["busy_n"] else 0.0) if measured else None
        energy = (row["energy_j"] if row and row["energy_n"] else 0.0) if energy_known else None
        out.append(DayUsage(run_id, uuid, day, a, b, b - a, busy, energy, row["intervals"] if row else 0))
    return out


def _shared_days(
    conn: Connection,
    ids: Sequence[str],
    spans: dict[str, tuple[float, float]],
    start: float | None,
    end: float | None,
    cuts: Sequence[float] = (),
) -> dict[tuple[str, str], list[DayUsage]]:
    """Day rows of the run-GPUs that overlapped another run on the same GPU."""
    tenants = cq.tenants_of(conn, ids, start, end)
    others = sorted({t["run_id"] for t in tenants} - set(spans))
    last = cq.last_interval_ends(conn, others) if others else {}
    all_spans = dict(spans)
    for t in tenants:
        if t["run_id"] not in all_spans:
            span = held_span(t["status"], t["started_at"], t["ended_at"], last.get(t["run_id"]))
            all_spans[t["run_id"]] = _clip(span, start, end)
    by_uuid: dict[str, list[tuple[str, float, float]]] = {}
    for t in tenants:
        a, b = all_spans[t["run_id"]]
        if b > a:
            by_uuid.setdefault(t["uuid"], []).append((t["run_id"], a, b))
    groups = [(uuid, group) for uuid, spans_ in by_uuid.items() for group in overlapping_groups(spans_)]
    if not groups:
        return {}
    pairs = {(run_id, uuid) for uuid, group in groups for run_id in group}
    found: dict[tuple[str, str], list[Reading]] = {}
    for r in cq.readings(conn, pairs, start, end):
        found.setdefault((r["run_id"], r["device_uuid"]), []).append(
            Reading(r["t0"], r["t1"], r["busy_s"], r["energy_j"], r["proc_sm_util_avg_pct"], r["proc_mem_max_b"])
        )
    out: dict[tuple[str, str], list[DayUsage]] = {}
    for uuid, group in groups:
        parts = attribute([Tenant(rid, *all_spans[rid], found.get((rid, uuid), [])) for rid in group])
        for rid, segments in parts.items():
            if rid in spans:  # a co-tenant outside this read only shaped the split
                measured = any(r.busy_s is not None for r in found.get((rid, uuid), []))
                out[(rid, uuid)] = days_from_segments(rid, uuid, segments, measured=measured, cuts=cuts)
    return out


def _logical_ids(conn: Connection, runs: dict[str, RunRow], scope: Scope) -> dict[str, RunRow]:
    """Each run with ``logical_id`` = the first attempt of its chain (attempt_of links) that the
    scope lets the reader see: a resumed training's attempts are one logical run."""
    resumed = list(itertools.compress(runs.values(), map(_ATTEMPT_OF, runs.values())))
    if not resumed:
        return runs
    known: dict[str, tuple[str | None, str | None]] = {r.id: (r.attempt_of, r.project) for r in resumed}
    missing = {r.attempt_of for r in resumed if r.attempt_of not in known}
    while missing:
        found = cq.chain_links(conn, missing)
        known.update(found)
        missing = {parent for parent, _ in found.values() if parent and parent not in known}
    out = dict(runs)
    for run in resumed:
        root, seen = run.id, {run.id}
        while True:
            parent = known.get(root, (None, None))[0]
            if not parent or parent in seen or parent not in known:
                break  # the start of the chain, a loop, or a deleted earlier attempt
            if scope is not None and known[parent][1] not in scope:
                break
            seen.add(parent)
            root = parent
        out[run.id] = _with_logical(run, root)
    return out


_ATTEMPT_OF = operator.attrgetter("attempt_of")


def _with_logical(run: RunRow, logical: str) -> RunRow:
    return run if logical == run.logical_id else run._replace(logical_id=logical)


def _periods(edges: Sequence[float], cut_times: Sequence[float]) -> tuple[list[int], list[tuple[float, bool]]]:
    """Day numbers where rollup periods begin, and per period (a time inside it, uniform?). A day
    holding a cut that is not at midnight is a period of its own, priced piece by piece."""
    mid_day = sorted({day_of(t) for t in cut_times if t % DAY_S})
    days = sorted({day_of(e) for e in edges} | {d + 1 for d in mid_day})
    periods = [(float((days[0] - 1) * DAY_S) if days else 0.0, True)]
    periods += [(float(d * DAY_S), d not in mid_day) for d in days]
    return days, periods


def _usages(
    days: Iterable[DayUsage], devices: dict[tuple[str, str], dict[str, Any]], runs: dict[str, RunRow]
) -> list[Usage]:
    out = []
    for d in days:
        dev = devices.get((d.run_id, d.device_uuid), {})
        out.append(
            Usage(
                d.run_id,
                dev.get("name"),
                dev.get("mig_profile"),
                runs[d.run_id].instance_type,
                d.t0,
                d.t1,
                d.alloc_s,
                d.busy_s,
                d.energy_j,
                1,
                d.device_uuid,
                d.share_rule,
            )
        )
    return out


def collect_runs(
    conn: Connection,
    ids: Sequence[str],
    *,
    scope: Scope,
    instance_type: str | None = None,
    cuts: Sequence[float] = (),
    tiered: Mapping[str, Sequence[dict[str, Any]]] | None = None,
    series: CutDays | None = None,
) -> UsageSet:
    """The runs ``ids`` (those in scope, replayed or not: they were asked for by name) and their
    Usages per GPU and day, from their intervals. ``cuts``: the rate card's price changes, where a
    day's busy time and energy are split exactly (as the chargeback splits them), not in
    proportion to held time. ``tiered``: run id -> its GPU intervals read whole through the
    ledger (raw days tiered into its series store and dropped): priced from those, per GPU,
    instead of from the SQL (which misses the dropped days) or the run's frozen rollups (per model).
    ``series``: where a series-only run's days with a price change are read from (``interval_day_usage``)."""
    rows = cq.run_rows(conn, scope=scope, replayed=True, ids=ids)
    runs = _logical_ids(conn, _run_rows(rows, cq.label_values(conn, "instance_type", ids=ids), instance_type), scope)
    # A GPU shared with another run is split from both runs' SQL intervals, gone with the day: such
    # a run keeps its rollups, which were split while the rows were there.
    read_whole = {rid: ivs for rid, ivs in (tiered or {}).items() if rid in runs and not _shared(conn, runs[rid])}
    rest = [r for r in runs.values() if r.id not in read_whole]
    days, devices = interval_day_usage(conn, rest, None, None, cuts, series=series)
    if read_whole:  # tiered runs, their intervals read through the ledger: per GPU, as before the drop
        whole = [runs[rid] for rid in read_whole]
        more, more_devices = interval_day_usage(conn, whole, None, None, cuts, [*itertools.chain(*read_whole.values())])
        days, devices = [*days, *more], {**devices, **more_devices}
    # Runs whose raw days were dropped (and not read whole above): their final rollups, per model.
    frozen = cq.frozen_rollups(conn, [rid for rid in runs if rid not in read_whole])
    if not frozen:
        return UsageSet(runs, _usages(days, devices, runs), devices)
    gone = {row.run_id for row in frozen}
    usages = _usages([d for d in days if d.run_id not in gone], devices, runs)
    usages += [
        Usage(row.run_id, row.gpu_name or None, row.mig_profile or None, runs[row.run_id].instance_type, row.t0,
              row.t1, row.alloc_s, row.busy_s, row.energy_j, row.gpus, None, row.share_rule)
        for row in frozen
    ]  # fmt: skip
    return UsageSet(runs, usages, devices)


def _shared(conn: Connection, run: RunRow) -> bool:
    """Whether another run held one of ``run``'s GPUs while it ran (by their start and end)."""
    end = math.inf if run.ended_at is None else run.ended_at
    return any(
        t["run_id"] != run.id
        and t["started_at"] < end
        and (math.inf if t["ended_at"] is None else t["ended_at"]) > run.started_at
        for t in cq.tenants_of(conn, [run.id], None, None)
    )


def collect_report(
    conn: Connection,
    *,
    scope: Scope,
    trend_start: float,
    start: float,
    end: float,
    edges: Iterable[float],
    cut_times: Sequence[float],
    group_keys: Sequence[str],
    replayed: bool = False,
    series: CutDays | None = None,
) -> UsageSet:
    """Everything a chargeback of [start, end) with a trend from ``trend_start`` prices.
    ``edges``: month starts, price changes and the window's edges; ``cut_times``: the price changes
    and window edges (a day holding one inside it is priced piece by piece); ``group_keys``: the
    run columns the trend groups by. Rollup rows of the window are kept as they are (``rollups``);
    those of the earlier months are summed per group and day in SQL (``groups``), so a trend costs
    one scan of the rollup table and no run rows. Runs not rolled up (``runs.rolled_up``) are read
    from their intervals, in the window and in the trend months alike. Runs metered from a
    replayed GPU trace are left out of all of it (a demo is not billed) unless ``replayed``.
    ``series``: where a series-only run's days with a price change are read from
    (store/series_cut_days.py)."""
    period_days, periods = _periods(sorted(set(edges)), cut_times)
    live_rows = cq.unrolled_runs(conn, scope=scope, replayed=replayed, start=trend_start, end=end)
    live_ids = {r[0] for r in live_rows}
    rows = cq.run_rows(conn, scope=scope, replayed=replayed, start=start, end=end)
    if live_rows:  # those of the trend months too
        in_window = {r[0] for r in rows}
        rows += [r for r in live_rows if r[0] not in in_window]
    first, last = day_of(start), day_of(end - 1e-6)
    rollups = cq.rollup_days(conn, scope=scope, replayed=replayed, first_day=first, last_day=last)
    if live_ids:
        rollups = [r for r in rollups if r[0] not in live_ids]
    # Instance types: rolled-up rows carry their run's (and are priced by it); the runs read from
    # their intervals take theirs from their labels.
    instances = cq.label_values(conn, "instance_type", ids=sorted(live_ids)) if live_ids else {}
    runs = _logical_ids(conn, _run_rows(rows, instances), scope)
    resumed = itertools.compress(runs.values(), map(_ATTEMPT_OF, runs.values()))
    roots = {r.logical_id for r in resumed} - runs.keys()
    if roots:  # first attempts of resumed runs that began before the window: named in the top runs
        extra = _run_rows(cq.run_rows(conn, scope=scope, replayed=replayed, ids=sorted(roots)), instances)
        runs.update({rid: _with_logical(run, rid) for rid, run in extra.items()})
    usage = UsageSet(runs, [], {}, rollups=rollups, periods=periods)
    usage.period_of_day = {d: bisect.bisect_right(period_days, d) for d in range(day_of(trend_start), last + 1)}
    cut_days = {day_of(t) for t in cut_times if t % DAY_S}
    usage.groups = _trend_groups(
        conn, scope, group_keys, day_of(trend_start), first - 1, live_ids, period_days, cut_days, replayed=replayed
    )
    live = [runs[rid] for rid in live_ids if rid in runs]
    if live:
        days, usage.devices = interval_day_usage(conn, live, trend_start, end, cut_times, series=series)
        usage.usages = _usages(days, usage.devices, runs)
    # A window's own end inside a day is a cut like a price change (start <= t <= end).
    mid_days = sorted({day_of(t) for t in cut_times if t % DAY_S and start <= t <= end})
    if mid_days:
        usage.usages += _exact_cut_days(conn, usage, mid_days, cut_times, series)
    return usage


def _exact_cut_days(
    conn: Connection,
    usage: UsageSet,
    days: Sequence[int],
    cut_times: Sequence[float],
    series: CutDays | None = None,
) -> list[Usage]:
    """A rollup row sums a whole day, so on a day a price changes within it could only be split
    in proportion to held time. For runs whose intervals are still there, such rows are replaced
    by those intervals, cut exactly at the change (the same figures as a run never rolled up);
    a series-only run's, by its rows of the day read from the store through ``series``, where
    it still holds them (otherwise the run keeps its rollups of the day)."""
    wanted = set(days)
    on_day: dict[int, set[str]] = {}
    for row in usage.rollups:
        if row[1] in wanted:
            on_day.setdefault(row[1], set()).add(row[0])
    ids = sorted(set().union(*on_day.values())) if on_day else []
    exact = cq.with_intervals(conn, ids) if ids else set()
    if series is not None and ids:
        exact |= series_day_sums.series_only(conn, ids)
    if not exact:
        return []
    instances = cq.label_values(conn, "instance_type", ids=sorted(exact))
    out: list[Usage] = []
    whole: set[tuple[str, int]] = set()  # (run, day) the store could not give: its rollups stay
    for day, run_ids in sorted(on_day.items()):
        rows = [usage.runs[rid]._replace(instance_type=instances.get(rid)) for rid in sorted(run_ids & exact)]
        before = set(series.unsplit) if series is not None else set()
        found, devices = interval_day_usage(conn, rows, day * DAY_S, (day + 1) * DAY_S, cut_times, series=series)
        if series is not None:
            whole |= {(rid, d) for rid, d in set(series.unsplit) - before if d == day}
        usage.devices.update(devices)
        out += _usages([d for d in found if (d.run_id, day) not in whole], devices, {r.id: r for r in rows})
    usage.rollups = [r for r in usage.rollups if not (r[1] in wanted and r[0] in exact and (r[0], r[1]) not in whole)]
    return out


def _trend_groups(
    conn: Connection,
    scope: Scope,
    group_keys: Sequence[str],
    first_day: int,
    last_day: int,
    live_ids: Collection[str],
    period_days: Sequence[int],
    exact_days: Collection[int] = (),
    *,
    replayed: bool,
) -> list[tuple[Any, ...]]:
    """UsageSet.groups: rollup sums per group, GPU kind and price period of the trend months.
    Measured and unmeasured GPUs stay in rows of their own, and so does each run on an
    ``exact_days`` day (cq.rollup_group_sums says why); replayed runs only with ``replayed``."""
    if last_day < first_day:
        return []
    n = len(group_keys)
    trend: dict[tuple[Any, ...], list[Any]] = {}
    rows = cq.rollup_group_sums(
        conn,
        scope=scope,
        replayed=replayed,
        keys=group_keys,
        first_day=first_day,
        last_day=last_day,
        period_days=period_days,
        exclude=live_ids,
        exact_days=exact_days,
    )
    for row in rows:  # '' and None name the same GPU kind: summed into one group
        name, profile, period, measured, own = row[n + 1 : n + 6]
        t0, t1, alloc, busy, energy, rule = row[n + 6 :]
        key = (*row[:n], row[n], name or None, profile or None, period, bool(measured), own)
        acc = trend.get(key)
        if acc is None:
            trend[key] = [t0, t1, alloc, busy, energy, rule]
            continue
        acc[0], acc[1], acc[2] = min(acc[0], t0), max(acc[1], t1), acc[2] + alloc
        if busy is not None:
            acc[3] = busy if acc[3] is None else acc[3] + busy
        if energy is not None:
            acc[4] = energy if acc[4] is None else acc[4] + energy
        if rule and (acc[5] is None or rule < acc[5]):  # "equal" < "memory" < "sm": keep the weakest
            acc[5] = rule
    return [(*key[:-2], *acc) for key, acc in trend.items()]
