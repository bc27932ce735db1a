"""The fleet simulation of docs/SCALE.md (issue 38, step 5), on the series store itself: not yet
through ``gpuledger serve``, which is not wired to the store.

    python benchmarks/fleet_sim.py [--gpus 100000] [--seconds 60] [--writers 4] [--batch-minutes 1]
                                   [--url chdb:///abs/dir] [--live-batch-rows N [--live-batch-ms MS]]
                                   [--compare-group]
                                   [--year-gpus N] [--runs-per-day 3] [--pg-runs 500000]
                                   [--skip-ingest] [--skip-year] [--skip-pg]

1. Ingest. ``--gpus`` / 8 node agents, each sending one minute of its 8 GPUs (96 intervals, the
   realistic telemetry of scale_storage.py: cut from the shipped GPU traces with sensor noise)
   per batch (``--batch-minutes``: more minutes a batch, as an agent that pushes less often),
   time compressed: batches go as fast as the store takes them, from ``--writers`` concurrent
   writers in a writer process that holds the store. Each agent keeps an outbox: a
   batch's token is logged before it is sent and acknowledged after ``write()`` returns. Half-way
   the writer process is SIGKILLed (inserts in flight), restarted on the same store, and resends
   what was logged and not acknowledged, then goes on. Printed: sustained intervals/s, p50/p99
   write latency per batch, the restarted writer process's CPU per batch (the engine's
   included), bytes per interval at rest; then per run the stored count and sums against what
   the agents sent (nothing lost, nothing doubled): raw rows, the per GPU day rollups and the
   per run day rollups chargeback reads.
   ``--live-batch-rows N``: the writers push as ``serve --series-live`` writes, through
   ``LiveSeries`` (store/series_live.py: the rows the store holds left out first, each push
   inside ``pushing()`` as if it held its run's lock), N > 0 gathering concurrent pushes into
   one insert per ``--live-batch-ms`` or N rows (group commit, store/series_batch.py), 0 one
   insert per push. ``--compare-group``: ``--rounds`` rounds of each, alternating, per-push
   first, each on a new store; intervals/s min / median / max per mode (``--live-batch-rows``,
   default 10,000, is the grouped mode's).
2. A year's chargeback (ClickHouse): a year of ``gpu_day_rollups`` for ``--year-gpus`` GPUs
   (default ``--gpus``) made in the engine (``INSERT ... SELECT FROM numbers()``: nodes of 8 GPUs,
   ``--runs-per-day`` jobs per node a day, each on all 8 GPUs, 60-95 % of the day allocated, busy
   and power per job; the store's view sums them per run and day into ``run_day_rollups`` as
   they go in), ``run_dims`` for every run, then ``monthly_chargeback()`` (team x project x user x
   month: allocated GPU-h, busy GPU-h, energy) timed over 3 rounds.
3. The same year on today's PostgreSQL layout: gpuledger's own chargeback (reports/cost) over the
   ledger's ``runs`` + ``gpu_rollups``, loaded as benchmarks/chargeback.py loads them (1,024 GPUs,
   ``--pg-runs`` runs), by team, project and user for each month of the year, timed over 3 rounds.
   The ratio is per rollup row: the PostgreSQL fleet is what loads here in minutes, not 100,000
   GPUs; what a 100,000-GPU year would take there is extrapolated, and said to be.

The machine is 2 cores shared with other work: every figure is of this machine at its load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from datetime import date
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

GPUS_PER_NODE, PER_MINUTE, INTERVAL_S = 8, 12, 5  # one minute of 8 GPUs at 5 s: 96 intervals
TEMPLATE_GPUS, TEMPLATE_HOURS = 64, 2  # realistic telemetry the agents' GPUs are cut from
PG = os.environ.get("GPULEDGER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


# -- the agents' telemetry -----------------------------------------------------------------------


class Fleet:
    """Deterministic batches: agent ``a``'s batch ``b`` is minute ``b`` of its run ``fleet-a``, so
    the writer, its restart and the check all know what an agent sent without shipping it."""

    def __init__(self, gpus: int, start: int, minutes: int = 1) -> None:
        import scale_storage as ss

        self.per_batch = PER_MINUTE * minutes  # intervals per GPU in a batch

        self.agents = max(1, gpus // GPUS_PER_NODE)
        self.start = start
        data = ss.intervals(TEMPLATE_GPUS, TEMPLATE_HOURS, INTERVAL_S, seed=1)
        per = len(data["gpu"]) // TEMPLATE_GPUS
        self.per = per
        # Per template GPU, its intervals as ledger values (time, seq and device added per batch).
        self.tpl: list[list[dict[str, Any]]] = [[] for _ in range(TEMPLATE_GPUS)]
        for i in range(len(data["gpu"])):
            v = {c: int(data[c][i]) for c in data}
            self.tpl[v["gpu"]].append({
                "samples": v["samples"], "busy_s": v["busy_ms"] / 1000, "util_method": "samples",
                "util_max_pct": v["util_max_cp"] / 100, "util_idle_s": v["idle_ms"] / 1000, "util_unknown_s": 0.0,
                "util_unmeasured_s": 0.0, "energy_j": v["energy_mj"] / 1000, "energy_method": "counter",
                "power_max_w": v["power_max_dw"] / 10, "mem_used_max_b": v["mem_max_mib"] << 20,
                "mem_used_last_b": v["mem_last_mib"] << 20, "mem_reserved_b": 553648128,
                "proc_mem_max_b": v["proc_mem_max_mib"] << 20, "proc_sm_util_avg_pct": v["proc_sm_cp"] / 100,
                "proc_method": "pid", "temp_max_c": v["temp_max_dc"] / 10,
                "sm_clock_avg_mhz": float(v["sm_clock_mhz"]), "mem_clock_max_mhz": float(v["mem_clock_mhz"]),
                "throttle_s": {"power": v["throttle_power_ms"] / 1000, "thermal": v["throttle_thermal_ms"] / 1000},
            })  # fmt: skip

    def schedule(self, index: int) -> tuple[int, int]:
        """The ``index``-th batch the fleet sends: every agent's minute 0, then every agent's minute 1..."""
        return index % self.agents, index // self.agents

    def batch(self, agent: int, minute: int) -> tuple[str, list[dict[str, Any]], str]:
        run_id = f"fleet-{agent:06d}"
        rows = []
        for g in range(GPUS_PER_NODE):
            tpl = self.tpl[(agent * GPUS_PER_NODE + g) % TEMPLATE_GPUS]
            k0 = (agent * 131 + minute * self.per_batch) % (self.per - self.per_batch)
            for i in range(self.per_batch):
                seq = minute * self.per_batch + i
                t0 = float(self.start + seq * INTERVAL_S)
                rows.append({"device_uuid": f"GPU-{agent:06d}-{g}", "seq": seq, "t0": t0, "t1": t0 + INTERVAL_S,
                             **tpl[k0 + i]})  # fmt: skip
        first, last = minute * self.per_batch, (minute + 1) * self.per_batch - 1
        return run_id, rows, f"{run_id}:{first}-{last}"


# -- the writer process --------------------------------------------------------------------------


def writer(args: argparse.Namespace) -> None:
    """Holds the store; resends what its outbox logged and was not acknowledged, then sends the
    schedule on from where the outbox stops, with ``--writers`` threads, until ``--until``."""
    from gpuledger.series.open import open_series

    work = Path(args.work)
    fleet = Fleet(args.gpus, args.start, args.batch_minutes)
    live = None
    if args.live_batch_rows is None:
        store = open_series(args.url, raw_days=args.raw_days)
        store.create()

        def put(run_id: str, rows: list[dict[str, Any]], token: str) -> int:
            return store.write(run_id, rows, [], token)
    else:  # as serve --series-live writes a push: the held lookup, per push or grouped
        from gpuledger.store.series_live import LiveSeries

        live = LiveSeries(args.url, create=True, batch_rows=args.live_batch_rows, batch_ms=args.live_batch_ms)
        store = live.reader

        def put(run_id: str, rows: list[dict[str, Any]], token: str) -> int:
            with live.pushing():  # the push holds its run's lock: a group waits for it
                return live.write(run_id, rows, [])

    logged = _lines(work / "outbox.log")
    acked = {int(x.split()[0]) for x in _lines(work / "acked.log")}
    resend = sorted({int(x) for x in logged} - acked)
    nxt = max((int(x) for x in logged), default=-1) + 1
    lock = threading.Lock()
    outbox = os.open(work / "outbox.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    ack = os.open(work / "acked.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    resent_stored = [0, len(resend)]
    written = [0]  # batches this process wrote

    def take() -> tuple[int, bool] | None:
        nonlocal nxt
        with lock:
            if resend:
                return resend.pop(), True
            if time.time() >= args.until:
                return None
            i = nxt
            nxt += 1
            os.write(outbox, f"{i}\n".encode())  # in the outbox before it is sent
            return i, False

    def work_loop() -> None:
        while (job := take()) is not None:
            i, again = job
            run_id, rows, token = fleet.batch(*fleet.schedule(i))
            t = time.perf_counter()
            n = put(run_id, rows, token)
            took = time.perf_counter() - t
            if again:
                with lock:
                    resent_stored[0] += n
            os.write(ack, f"{i} {took * 1e6:.0f} {n} {time.time():.3f}\n".encode())
            with lock:
                written[0] += 1

    # CPU of the whole process (the engine runs in it) while writing: a figure the machine's load
    # from other work moves much less than the wall-clock rate.
    cpu0 = time.process_time()
    threads = [threading.Thread(target=work_loop) for _ in range(args.writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu = time.process_time() - cpu0
    group = live.group if live is not None else None
    print(json.dumps({"resent": resent_stored[1], "resent_rows_stored": resent_stored[0], "cpu_s": cpu,
                      "cpu_batches": written[0], "flushes": group.flushes if group else None,
                      "pushes": group.pushes if group else None,
                      "repaired": getattr(store, "rollups_repaired", None)}), flush=True)  # fmt: skip
    if live is not None:
        live.close()
    store.close()


def _lines(path: Path) -> list[str]:
    """Whole lines only: a line a SIGKILL cut short was not logged."""
    if not path.exists():
        return []
    text = path.read_text()
    return text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]


def _spawn(args: argparse.Namespace, work: Path, until: float) -> subprocess.Popen[str]:
    cmd = [sys.executable, __file__, "--role", "writer", "--work", str(work), "--url", args.url,
           "--gpus", str(args.gpus), "--writers", str(args.writers), "--start", str(args.start),
           "--until", f"{until:.3f}", "--raw-days", str(args.raw_days),
           "--batch-minutes", str(args.batch_minutes)]  # fmt: skip
    if args.live_batch_rows is not None:
        cmd += ["--live-batch-rows", str(args.live_batch_rows), "--live-batch-ms", str(args.live_batch_ms)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def ingest(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    work = tmp / "outbox"
    work.mkdir()
    t_begin = time.time()
    half = t_begin + args.seconds / 2
    first = _spawn(args, work, until=t_begin + args.seconds)
    # Kill once the half-way mark has passed and some batch is in flight (logged, not acknowledged).
    while True:
        if first.poll() is not None:
            raise SystemExit(f"the writer ended before it was killed (exit {first.returncode})")
        if time.time() >= half and set(_lines(work / "outbox.log")) - {
            x.split()[0] for x in _lines(work / "acked.log")
        }:
            break
        time.sleep(0.01)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    t_kill = time.time()
    in_flight = len(set(_lines(work / "outbox.log")) - {x.split()[0] for x in _lines(work / "acked.log")})
    second = _spawn(args, work, until=t_begin + args.seconds)
    out, _ = second.communicate()
    if second.returncode:
        raise SystemExit(f"the restarted writer failed (exit {second.returncode})")
    t_end = time.time()
    acks = [x.split() for x in _lines(work / "acked.log")]
    lat = sorted(int(a[1]) / 1000 for a in acks)
    # Writing time: each process from its first acknowledgement to its last (not its start-up).
    steady = 0.0
    for phase in ([a for a in acks if float(a[3]) <= t_kill], [a for a in acks if float(a[3]) > t_kill]):
        if phase:
            steady += float(phase[-1][3]) - float(phase[0][3])
    sent = sorted(int(x) for x in _lines(work / "outbox.log"))
    return {
        "work": work, "sent": sent, "acks": len(acks), "lat_ms": lat, "wall": t_end - t_begin,
        "steady_s": steady, "n_acked": len(acks), "in_flight": in_flight,
        **json.loads(out.strip().splitlines()[-1]),
    }  # fmt: skip


def check(args: argparse.Namespace, sent: list[int]) -> dict[str, Any]:
    """Per run: stored count and sums (raw rows and rollups) against what the agents sent."""
    from gpuledger.series.open import open_series

    fleet = Fleet(args.gpus, args.start, args.batch_minutes)
    want: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for i in sent:
        run_id, rows, _ = fleet.batch(*fleet.schedule(i))
        acc = want[run_id]
        acc[0] += len(rows)
        acc[1] += sum(int(r["busy_s"] * 1000 + 0.5) for r in rows)
        acc[2] += sum(int(r["energy_j"] * 1000 + 0.5) for r in rows)
    store = open_series(args.url, raw_days=args.raw_days)
    try:
        raw = store.client.query(
            f"SELECT n.name, count(), sum(busy_ms), sum(energy_mj) FROM {store.layout.table('gpu_intervals')} AS g "
            f"JOIN (SELECT hash, any(name) AS name FROM {store.layout.table('series_names')} WHERE kind = 'run' "
            "GROUP BY hash) AS n ON g.run = n.hash GROUP BY n.name"
        )
        rolled = store.client.query(
            f"SELECT n.name, sum(intervals), sum(busy_ms), sum(energy_mj) FROM {store.layout.table('gpu_day_rollups')} "
            f"AS g JOIN (SELECT hash, any(name) AS name FROM {store.layout.table('series_names')} WHERE kind = 'run' "
            "GROUP BY hash) AS n ON g.run = n.hash GROUP BY n.name"
        )
        by_day = store.client.query(
            f"SELECT n.name, sum(busy_ms), sum(energy_mj) FROM {store.layout.table('run_day_rollups')} AS g "
            f"JOIN (SELECT hash, any(name) AS name FROM {store.layout.table('series_names')} WHERE kind = 'run' "
            "GROUP BY hash) AS n ON g.run = n.hash GROUP BY n.name"
        )
        store.compact()
        at_rest = store.bytes_at_rest()
    finally:
        store.close()
    got_raw = {r[0]: [int(x) for x in r[1:]] for r in raw}
    got_rolled = {r[0]: [int(x) for x in r[1:]] for r in rolled}
    bad_raw = sorted(r for r in set(want) | set(got_raw) if want.get(r) != got_raw.get(r))
    got_by_day = {r[0]: [int(x) for x in r[1:]] for r in by_day}
    bad_rolled = sorted(r for r in set(want) | set(got_rolled) if want.get(r) != got_rolled.get(r))
    bad_rolled += sorted(r for r in set(want) | set(got_by_day) if want[r][1:] != got_by_day.get(r))
    intervals = sum(v[0] for v in want.values())
    detail = [f"{r}: sent {want.get(r)}, raw {got_raw.get(r)}, per GPU day {got_rolled.get(r)}, "
              f"per run day {got_by_day.get(r)}" for r in sorted(set(bad_raw) | set(bad_rolled))[:5]]  # fmt: skip
    return {"runs": len(want), "intervals": intervals, "stored": sum(v[0] for v in got_raw.values()),
            "bad_raw": bad_raw, "bad_rollups": bad_rolled, "bytes": at_rest, "detail": detail}  # fmt: skip


# -- a year's chargeback -------------------------------------------------------------------------


def year_clickhouse(args: argparse.Namespace) -> None:
    """(In its own process: chDB opens one folder per process.) A year of rollups and run dims
    made in the engine, then the chargeback timed."""
    from gpuledger.series.open import open_series

    store = open_series(f"chdb://{args.work}/year", raw_days=7)
    store.create()
    nodes = max(1, args.year_gpus // GPUS_PER_NODE)
    jobs = args.runs_per_day
    n = nodes * 365 * jobs * GPUS_PER_NODE
    t = time.perf_counter()
    # Row i: GPU i % 8 of job (i / 8) % jobs on node (i / 8 / jobs) % nodes, day i / (8 * jobs * nodes).
    # Each job has its own share of the day, busy fraction and power; the run key is its number.
    run = f"intDiv(number, {GPUS_PER_NODE})"
    day = f"intDiv(number, {GPUS_PER_NODE * jobs * nodes})"
    node = f"intDiv(number, {GPUS_PER_NODE * jobs}) % {nodes}"
    alloc = f"toInt64(86400000 * (0.60 + (cityHash64({run}, 1) % 3500) / 10000.0) / {jobs})"
    busy = f"toInt64({alloc} * (0.15 + (cityHash64({run}, 2) % 8000) / 10000.0))"
    watts = f"(60 + cityHash64({node}, 3) % 640)"  # per node: L4 to H100
    store.client.command(
        f"INSERT INTO {store.layout.table('gpu_day_rollups')} SELECT {run} AS run, "
        f"{node} * {GPUS_PER_NODE} + number % {GPUS_PER_NODE} AS gpu, toDate('2026-01-01') + {day} AS day, "
        f"toUInt64({alloc} / 5000) AS intervals, intervals * 30 AS samples, {alloc} AS allocated_ms, "
        f"{busy} AS busy_ms, intervals AS busy_n, {alloc} - busy_ms AS idle_ms, intervals AS idle_n, "
        "toInt64(0) AS unknown_ms, intervals AS unknown_n, toInt64(0) AS unmeasured_ms, intervals AS unmeasured_n, "
        f"toInt64((busy_ms * {watts} + idle_ms * 60)) AS energy_mj, intervals AS energy_n FROM numbers({n})",
        {"insert_deduplicate": 0, "max_insert_threads": 2},
    )
    # Users belong to a team and one of its projects: 2,000 users, 25 teams, 100 projects.
    runs = nodes * 365 * jobs
    store.client.command(
        f"INSERT INTO {store.layout.table('run_dims')} SELECT number AS run, concat('run-', toString(number)), "
        "concat('team-', toString(u % 25)), concat('proj-', toString(u % 25 * 4 + intDiv(u, 25) % 4)), "
        f"concat('user-', toString(u)), 1 FROM (SELECT number, cityHash64(number, 4) % 2000 AS u FROM numbers({runs}))",
        {"insert_deduplicate": 0},
    )
    made = time.perf_counter() - t
    times = []
    result: list[Any] = []
    for _ in range(args.rounds):
        t = time.perf_counter()
        result = store.monthly_chargeback(date(2026, 1, 1), date(2026, 12, 31))
        times.append(time.perf_counter() - t)
    rows = store.client.query(f"SELECT count(), sum(allocated_ms) FROM {store.layout.table('gpu_day_rollups')}")[0]
    run_days = store.client.query(f"SELECT count() FROM {store.layout.table('run_day_rollups')}")[0][0]
    store.close()
    print(json.dumps({"rollup_rows": int(rows[0]), "run_day_rows": int(run_days), "runs": runs, "made_s": made,
                      "times": times,
                      "groups": len(result), "allocated_gpu_h": sum(r[4] for r in result) / 3.6e6,
                      "check_allocated_gpu_h": int(rows[1]) / 3.6e6}), flush=True)  # fmt: skip


def year_postgres(args: argparse.Namespace) -> dict[str, Any]:
    """gpuledger's own chargeback over today's ledger layout (runs + gpu_rollups), month by month."""
    import chargeback as cbb

    from gpuledger.core.pricing.ratecard_load import parse_rate_card
    from gpuledger.reports.cost.costing import chargeback, month_window
    from gpuledger.store import Ledger

    url, drop, fresh = cbb._pg_schema(args.pg_url, args.pg_schema)  # the benchmark's own helper
    try:
        t = time.perf_counter()
        counts = cbb.load(url, args.pg_runs) if fresh else {}
        loaded = time.perf_counter() - t
        card = parse_rate_card(cbb.RATES, "benchmark card")
        import sqlalchemy as sa

        engine = sa.create_engine(url)
        with engine.connect() as conn:
            rollups = conn.exec_driver_sql("SELECT count(*) FROM gpu_rollups").scalar()
        engine.dispose()
        led = Ledger(url)
        times = []
        groups = 0
        for _ in range(args.rounds):
            t = time.perf_counter()
            groups = 0
            for m in range(1, 13):
                lo, hi = month_window(f"2026-{m:02d}")
                cb = chargeback(led, scope=None, card=card, start=lo, end=hi, by=("team", "project", "user"))
                groups += len(cb.groups)
            times.append(time.perf_counter() - t)
        led.close()
        return {"rollup_rows": int(rollups), "counts": counts, "loaded_s": loaded, "times": times, "groups": groups}
    finally:
        if not args.pg_schema:
            drop()


# -- main ----------------------------------------------------------------------------------------


def _mmm(xs: list[float]) -> str:
    return f"min {min(xs):.2f} / median {statistics.median(xs):.2f} / max {max(xs):.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=100_000, help="simulated GPUs (agents of 8; default 100,000)")
    ap.add_argument("--seconds", type=float, default=60.0, help="ingest wall time, the kill at half (default 60)")
    ap.add_argument("--writers", type=int, default=4, help="concurrent writers in the writer process (default 4)")
    ap.add_argument("--batch-minutes", type=int, default=1, help="minutes of an agent's 8 GPUs per batch (default 1)")
    ap.add_argument("--url", help="series store URL (default: chdb:// in a new temporary folder)")
    ap.add_argument("--raw-days", type=int, default=7)
    ap.add_argument("--year-gpus", type=int, help="GPUs of the year's chargeback (default --gpus)")
    ap.add_argument("--runs-per-day", type=int, default=3, help="jobs per node and day in the year (default 3)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pg-url", default=PG)
    ap.add_argument("--pg-runs", type=int, default=500_000, help="runs of the PostgreSQL year (1,024 GPUs)")
    ap.add_argument("--pg-schema", help="use (and keep) this PostgreSQL schema; loaded if empty")
    ap.add_argument("--live-batch-rows", type=int, help="write as serve --series-live: 0 per push, N > 0 grouped")
    ap.add_argument("--live-batch-ms", type=float, default=1000.0, help="a group's longest wait (default 1000)")
    ap.add_argument("--compare-group", action="store_true", help="per-push and grouped live writes, alternating")
    ap.add_argument("--skip-ingest", action="store_true")
    ap.add_argument("--skip-year", action="store_true")
    ap.add_argument("--skip-pg", action="store_true")
    ap.add_argument("--role", choices=("main", "writer", "year"), default="main", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--until", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "writer":
        return writer(args)
    args.year_gpus = args.year_gpus or args.gpus
    if args.role == "year":
        return year_clickhouse(args)
    tmp = Path(tempfile.mkdtemp(prefix="fleet-sim-"))
    try:
        run(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the store (unless --url), the outbox, the year's folder


def compare_group(args: argparse.Namespace, tmp: Path) -> None:
    """Per-push and grouped live writes, alternating, each round on a new store."""
    grouped_rows = args.live_batch_rows or 10_000
    rates: dict[str, list[float]] = {"per push": [], "grouped": []}
    for r in range(args.rounds):
        for mode, rows in (("per push", 0), ("grouped", grouped_rows)):
            folder = tmp / f"round-{r}-{rows}"
            folder.mkdir()
            one = argparse.Namespace(**{**vars(args), "live_batch_rows": rows, "url": f"chdb://{folder}/series"})
            print(f"-- round {r + 1}, {mode} (--live-batch-rows {rows}), load {_load()}", flush=True)
            rates[mode].append(ingest_round(one, folder))
    for mode, xs in rates.items():
        print(f"{mode:9s} intervals/s while writing over {len(xs)} rounds: {_mmm(xs)}", flush=True)


def _load() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run(args: argparse.Namespace, tmp: Path) -> None:
    args.start = int(time.time()) // 86400 * 86400 - 86400  # yesterday: inside the raw window
    print(f"fleet_sim {date.today()} load {os.getloadavg()[0]:.1f}", flush=True)
    if args.compare_group:
        return compare_group(args, tmp)
    args.url = args.url or f"chdb://{tmp}/series"
    if not args.skip_ingest:
        ingest_round(args, tmp)
    year(args, tmp)


def ingest_round(args: argparse.Namespace, tmp: Path) -> float:
    """The ingest with its kill and restart, checked; the intervals/s while writing."""
    res = ingest(args, tmp)
    got = check(args, res["sent"])
    rate = got["intervals"] / res["wall"]
    steady = res["n_acked"] * GPUS_PER_NODE * PER_MINUTE * args.batch_minutes / max(res["steady_s"], 1e-9)
    lat = res["lat_ms"]
    p50, p99 = lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(f"ingest   {args.gpus:,} GPUs ({args.gpus // GPUS_PER_NODE:,} agents), {args.writers} writers, "
          f"{res['wall']:.0f} s: {len(res['sent']):,} batches of {GPUS_PER_NODE * PER_MINUTE * args.batch_minutes} "
          f"intervals, {got['intervals']:,} intervals sent, "
          f"{got['stored']:,} stored", flush=True)  # fmt: skip
    print(f"         sustained {rate:,.0f} intervals/s over the whole run, kill and restart included "
          f"({rate * INTERVAL_S:,.0f} GPUs at 5 s); {steady:,.0f} intervals/s while writing "
          f"({steady * INTERVAL_S:,.0f} GPUs); per batch p50 {p50:.1f} ms, p99 {p99:.1f} ms",
          flush=True)  # fmt: skip
    per_cpu = res["cpu_batches"] * GPUS_PER_NODE * PER_MINUTE * args.batch_minutes / max(res["cpu_s"], 1e-9)
    cpu_ms = res["cpu_s"] * 1000 / max(1, res["cpu_batches"])
    print(f"         CPU of the restarted writer process (engine included): {cpu_ms:.1f} ms per batch over "
          f"{res['cpu_batches']:,} batches = {per_cpu:,.0f} "
          "intervals per CPU-second", flush=True)  # fmt: skip
    print(f"         SIGKILLed with {res['in_flight']} batches in flight; the restart resent {res['resent']}: "
          f"{res['resent_rows_stored']} rows stored by the resend, the rest stored before the kill (dropped "
          "by token; through LiveSeries left out as held)"
          + (f"; {res['repaired']} rollup rows repaired (views the kill cut off)" if res.get("repaired") is not None
             else ""), flush=True)  # fmt: skip
    per = got["bytes"] / max(1, got["stored"])
    print(f"         at rest {got['bytes']:,} B = {per:.1f} B per interval", flush=True)
    ok = not got["bad_raw"] and not got["bad_rollups"] and got["stored"] == got["intervals"]
    verdict = "nothing lost, nothing doubled" if ok else f"MISMATCH {got['bad_raw'][:5]} {got['bad_rollups'][:5]}"
    print(f"         per run ({got['runs']:,} runs), raw rows and rollups against what the agents sent: {verdict}",
          flush=True)  # fmt: skip
    if res.get("flushes") is not None:
        print(f"         restarted writer: {res['pushes']:,} pushes in {res['flushes']:,} inserts "
              f"({res['pushes'] / max(1, res['flushes']):.1f} pushes each)", flush=True)  # fmt: skip
    if not ok:
        for line in got["detail"]:
            print(f"         {line}", flush=True)
        if not args.compare_group:
            raise SystemExit(1)
    return steady


def year(args: argparse.Namespace, tmp: Path) -> None:
    """A year's chargeback on ClickHouse and on today's PostgreSQL layout (parts 2 and 3)."""
    if not args.skip_year:
        cmd = [sys.executable, __file__, "--role", "year", "--work", str(tmp), "--year-gpus", str(args.year_gpus),
               "--runs-per-day", str(args.runs_per_day), "--rounds", str(args.rounds)]  # fmt: skip
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        ch = json.loads(out.strip().splitlines()[-1])
        print(f"year CH  {args.year_gpus:,} GPUs, {ch['rollup_rows']:,} rollup rows ({ch['run_day_rows']:,} per run "
              f"and day, what chargeback reads), {ch['runs']:,} runs, made in "
              f"{ch['made_s']:.0f} s; chargeback team x project x user x month ({ch['groups']:,} rows, "
              f"{ch['allocated_gpu_h']:,.0f} GPU-h = {ch['check_allocated_gpu_h']:,.0f}): {_mmm(ch['times'])} s "
              f"over {len(ch['times'])} rounds", flush=True)  # fmt: skip
    if not args.skip_pg:
        pg = year_postgres(args)
        loaded = f"{pg['counts']['runs']:,} runs loaded in {pg['loaded_s']:.0f} s" if pg["counts"] else "kept schema"
        print(f"year PG  1,024 GPUs, {pg['rollup_rows']:,} gpu_rollups rows ({loaded}); "
              "gpuledger chargeback by team, project, user, each month of 2026 "
              f"({pg['groups']:,} rows): {_mmm(pg['times'])} s over {len(pg['times'])} rounds", flush=True)  # fmt: skip
        if not args.skip_year:
            per_ch = statistics.median(ch["times"]) / ch["rollup_rows"] * 1e9
            per_pg = statistics.median(pg["times"]) / pg["rollup_rows"] * 1e9
            extrapolated = per_pg * ch["rollup_rows"] / 1e9
            print(f"ratio    per rollup row: PostgreSQL {per_pg:,.0f} ns, ClickHouse {per_ch:,.1f} ns "
                  f"({per_pg / per_ch:,.0f}x); PostgreSQL at {ch['rollup_rows']:,} rows, EXTRAPOLATED "
                  f"linearly: {extrapolated:,.0f} s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
