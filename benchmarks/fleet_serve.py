"""The fleet simulation through ``gpuledger serve`` (docs/SCALE.md, issue 38 step 6): simulated
node agents push their runs through two ``serve --series URL --series-live`` replicas into a
PostgreSQL ledger and a series store; one replica is SIGKILLed mid-run and its agents resend to
the other; then nothing may be lost or doubled, in the ledger or in the store.

    python benchmarks/fleet_serve.py [--agents 64] [--seconds 60] [--senders 8]
                                     [--store postgres|chdb] [--replicas 2] [--no-kill]

- Agents: ``--agents`` nodes of 8 GPUs, each one run, each batch one minute of its 8 GPUs
  (96 intervals) of the realistic telemetry benchmarks/fleet_sim.py makes (imported, not copied),
  sent as the agent sends it (compact ``gpu_rows``), time compressed: as fast as the servers
  answer, from ``--senders`` threads. An agent keeps what was not acknowledged (its outbox): after
  a failure it sends the unacknowledged minutes again together with the next one, in one push
  (another grouping, so another dedup token: what the store must hold once all the same) to the
  other replica.
- Half-way through ``--seconds`` the first replica's process is SIGKILLed (pushes in flight).
- Then per run, the ledger's and the store's count and sums (busy ms, energy mJ, samples, as the
  store's units) are compared with what the agents had acknowledged (nothing lost) and sent
  (nothing doubled: each (GPU, seq) once).
- Printed: sustained intervals/s (acknowledged, over the sending time), p50/p99 push latency,
  bytes per GPU interval at rest in the store and in the ledger's ``gpu_intervals``, the load,
  and the CPU per acknowledged push over the sending time: of the ``serve`` processes
  (``server_cpu_ms_per_push``, user + system, psutil) and of the PostgreSQL backends connected
  to them (``pg_backend_cpu_ms_per_push``: those alive at the end, the ledger's and the store's;
  a pooled connection closed meanwhile is missed, so a lower bound). On a loaded machine the
  CPU per push is steadier than intervals/s, which the other work's share of the cores moves.

The store: ``postgres`` is the compact PostgreSQL store (a schema of the same server), which two
server processes can share; chDB runs in-process and one folder opens in one process only, so
``--store chdb`` needs ``--replicas 1`` (the kill is then a restart of the same replica).
The machine is 2 cores shared with other work: every figure is of this machine at its load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

PG = os.environ.get("GPULEDGER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
NS = uuid.UUID("6f1c3a52-8e0b-4d7e-9a51-3c0f2b7d1e44")  # run ids of the simulated agents


def _load() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


# -- the servers -------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Replica:
    def __init__(self, db: str, series: str, work: Path, name: str, live: bool = True, only: bool = False) -> None:
        self.live, self.only = live, only
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db, self.series, self.work, self.name = db, series, work, name
        self.proc: subprocess.Popen[bytes] | None = None
        self.spent_s, self.cpu_mark = 0.0, 0.0

    def start(self) -> None:
        env = {
            **os.environ, "GPULEDGER_SERIES": self.series, "GPULEDGER_SERIES_LIVE": "1" if self.live else "0",
            "GPULEDGER_SERIES_ONLY": "1" if self.only else "0",
            "GPULEDGER_AUDIT_CHECKPOINT": str(self.work / f"{self.name}.checkpoint.json"),
            "GPULEDGER_RATE_TOKEN_PER_S": "0", "GPULEDGER_RATE_IP_PER_S": "0", "GPULEDGER_LOST_AFTER_S": "0",
            "GPULEDGER_TOKEN_CACHE_S": "60",
        }  # fmt: skip
        log = open(self.work / f"{self.name}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuledger", "serve", "--db", self.db, "--port", str(self.port), "--unsigned",
             "--log-level", "warning"],
            stdout=log, stderr=log, env=env, start_new_session=True,
        )  # fmt: skip
        import httpx

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"serve {self.name} exited with {self.proc.returncode}: see {self.work}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        raise SystemExit(f"serve {self.name} did not answer in 60 s")

    def cpu_s(self) -> float:
        """User + system CPU seconds of the serve process and its children so far (0 once gone)."""
        import psutil

        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        try:
            procs = [psutil.Process(self.proc.pid)]
            procs += procs[0].children(recursive=True)
            return sum(t.user + t.system for p in procs for t in [p.cpu_times()])
        except psutil.Error:
            return 0.0

    def backends(self) -> set[int]:
        """The local ports of this process's TCP connections (to PostgreSQL, among others)."""
        import psutil

        if self.proc is None or self.proc.poll() is not None:
            return set()
        try:
            return {c.laddr.port for c in psutil.Process(self.proc.pid).net_connections("tcp") if c.raddr}
        except psutil.Error:
            return set()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.spent_s += self.cpu_s() - self.cpu_mark
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def mark(self) -> None:
        """From now on, CPU counts into ``spent_s``."""
        self.cpu_mark = self.cpu_s()

    def spent(self) -> float:
        """CPU seconds since ``mark``, across a kill (what the killed process had used until then)."""
        return self.spent_s + (
            self.cpu_s() - self.cpu_mark if self.proc is not None and self.proc.poll() is None else 0
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


# -- the agents --------------------------------------------------------------------------------


class Agent:
    """One node: its run, the minutes it had acknowledged, and those sent and not yet acknowledged."""

    def __init__(self, index: int, fleet: Any, start: int) -> None:
        self.index, self.fleet, self.start = index, fleet, start
        self.run_id = str(uuid.uuid5(NS, f"fleet-{index}"))
        self.acked = 0  # minutes 0 .. acked-1 acknowledged
        self.replica = index  # taken modulo the replicas there are (one with chDB)
        self.resends = 0

    def body(self, minutes: range) -> dict[str, Any]:
        from gpuledger.core.wire import GPU_COLUMNS

        rows: list[list[Any]] = []
        for m in minutes:
            _, gpu, _ = self.fleet.batch(self.index, m)
            rows += [[r[c] for c in GPU_COLUMNS] for r in gpu]
        host = f"sim-node-{self.index:05d}"
        return {
            "run": {"id": self.run_id, "command": ["python", "train.py"], "user": "sim", "host": host, "cwd": "/w",
                    "started_at": float(self.start), "labels": {"project": "fleet", "team": f"t{self.index % 4}"}},
            "devices": [{"index": g, "uuid": f"GPU-{self.index:06d}-{g}", "name": "NVIDIA H100 80GB HBM3",
                         "memory_total_b": 80 * 2**30} for g in range(8)],
            "gpu_rows": rows,
        }  # fmt: skip


def _send(agents: list[Agent], replicas: list[Replica], token: str, until: float, out: dict[str, Any]) -> None:
    """One sender thread: its agents' next minutes, round robin, until ``until``; a failed push is
    sent again with the next minute, to the other replica."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"}
    lat: list[float] = out["lat"]
    with httpx.Client(timeout=60) as client:
        while time.time() < until:
            for a in agents:
                pending = 1 if a.resends == 0 else min(a.resends + 1, 3)
                minutes = range(a.acked, a.acked + pending)
                body = a.body(minutes)
                t0 = time.perf_counter()
                try:
                    url = replicas[a.replica % len(replicas)].url
                    got = client.post(url + "/api/v1/ingest", json=body, headers=headers)
                    ok = got.status_code == 200
                    if not ok and got.status_code < 500:
                        raise SystemExit(f"push refused: {got.status_code} {got.text[:300]}")
                except httpx.TransportError:
                    ok = False
                if ok:
                    lat.append(time.perf_counter() - t0)
                    a.acked += len(minutes)
                    out["acked"] += len(body["gpu_rows"])
                    a.resends = 0
                else:  # the replica is gone (or said 5xx): the outbox keeps the minutes, the other replica gets them
                    a.resends += 1
                    out["failed"] += 1
                    a.replica += 1
                    time.sleep(0.1)  # an agent's back-off (shortened): no busy loop while a lone replica restarts
                if time.time() >= until:
                    break


def _pg_cpu(replicas: list[Replica]) -> dict[int, float]:
    """backend pid -> its CPU seconds so far, of the PostgreSQL backends the replicas are connected to."""
    import psutil
    import psycopg

    ports = set().union(*(r.backends() for r in replicas))
    with psycopg.connect(PG, autocommit=True) as conn:
        pids = [p for (p,) in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s)", (sorted(ports),)
        )]  # fmt: skip
    out = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system
    return out


# -- the check ---------------------------------------------------------------------------------


def check(agents: list[Agent], fleet: Any, db: str, series: str | None, only: bool = False) -> dict[str, Any]:
    """Per run: the ledger's and the store's count and sums against the acknowledged minutes.
    ``only`` (serve --series-only): the ledger holds no rows; its seq ranges must cover every
    acknowledged interval once."""
    import sqlalchemy as sa

    from gpuledger.series import quantum
    from gpuledger.store import Ledger
    from gpuledger.store.series_tier import open_store

    def sums(rows: list[dict[str, Any]]) -> tuple[int, int, int, int]:
        keys = {(r["device_uuid"], int(r["seq"])) for r in rows}
        q = [quantum.quantize_gpu(r) for r in rows]
        return (
            len(rows) - len(keys),  # doubled
            len(rows),
            sum(quantum.to_units(r["busy_s"], 1000) for r in q),
            sum(quantum.to_units(r["energy_j"], 1000) for r in q),
        )

    bad_ledger, bad_store, intervals = [], [], 0
    store = open_store(series, create=False) if series else None
    try:
        with Ledger(db) as led:
            g = sa.table(
                "gpu_intervals", *(sa.column(c) for c in ("run_id", "device_uuid", "seq", "busy_s", "energy_j"))
            )
            for a in agents:
                sent: list[dict[str, Any]] = []
                for m in range(a.acked):
                    sent += fleet.batch(a.index, m)[1]
                intervals += len(sent)
                # a minute in flight at the kill may be stored without its acknowledgement: the
                # agent sends it again; it counts once, from what the ledger holds
                want = sums(sent)
                got_ledger = led.read(
                    lambda c, a=a: [dict(r._mapping) for r in c.execute(sa.select(g).where(g.c.run_id == a.run_id))]
                )
                if only:  # no rows in the ledger; its segments hold every acknowledged seq once
                    if got_ledger or _segment_count(led, a.run_id) < len(sent):
                        bad_ledger.append({"run": a.run_id, "rows": len(got_ledger), "want": len(sent)})
                    got_ledger = None
                got_store = store.gpu_intervals(a.run_id) if store else None
                for found, bad in ((got_ledger, bad_ledger), (got_store, bad_store)):
                    if found is None:
                        continue
                    have = sums([r for r in found if int(r["seq"]) < a.acked * fleet.per_batch])
                    if have != want or sums(found)[0]:
                        bad.append({"run": a.run_id, "want": want, "got": sums(found)})
            ledger_bytes = led.read(
                lambda c: c.exec_driver_sql(
                    "SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree('gpu_intervals')"
                ).scalar()
            )
            only_bytes = led.read(
                lambda c: c.exec_driver_sql(
                    "SELECT coalesce(sum(pg_total_relation_size(t)), 0) FROM unnest(ARRAY["
                    "'series_segments', 'series_day_sums', 'series_only_runs']::regclass[]) t"
                ).scalar()
            )
        store_bytes = store.bytes_at_rest() if store else 0
    finally:
        if store:
            store.close()
    return {
        "runs": len(agents), "intervals": intervals, "bad_ledger": bad_ledger, "bad_store": bad_store,
        "store_bytes": store_bytes, "ledger_bytes": int(ledger_bytes), "only_bytes": int(only_bytes),
    }  # fmt: skip


def _segment_count(led: Any, run_id: str) -> int:
    """The GPU seqs the run's segments cover (serve --series-only)."""
    import sqlalchemy as sa

    from gpuledger.store import schema

    c = schema.series_segments.c
    q = sa.select(sa.func.coalesce(sa.func.sum(c.last_seq - c.first_seq + 1), 0)).where(
        c.run_id == run_id, c.device_uuid != ""
    )
    return int(led.read(lambda conn: conn.scalar(q)))


# -- main --------------------------------------------------------------------------------------


def _schema_url(name: str) -> str:
    import psycopg

    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    return f"postgresql+psycopg://{PG.split('://', 1)[1]}?options=-csearch_path%3D{name}"


def _drop_schemas(*names: str) -> None:
    import psycopg

    with psycopg.connect(PG, autocommit=True) as conn:
        for n in names:
            conn.execute(f'DROP SCHEMA IF EXISTS "{n}" CASCADE')


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=64, help="nodes of 8 GPUs, one run each")
    p.add_argument("--seconds", type=float, default=60.0, help="sending time")
    p.add_argument("--senders", type=int, default=8, help="concurrent sender threads")
    p.add_argument("--store", choices=["postgres", "chdb"], default="postgres")
    p.add_argument("--replicas", type=int, choices=[1, 2], default=2)
    p.add_argument("--no-kill", action="store_true", help="no SIGKILL half-way")
    p.add_argument("--no-live", action="store_true", help="the baseline: serve without --series-live, no store")
    p.add_argument(
        "--series-only", action="store_true",
        help="serve --series-only: the runs' intervals in the store only, the ledger their seq ranges and day sums",
    )  # fmt: skip
    p.add_argument("--keep", action="store_true", help="keep the schemas and folder")
    args = p.parse_args()
    if args.store == "chdb" and args.replicas != 1:
        raise SystemExit("chDB opens one folder in one process: --store chdb needs --replicas 1")
    import fleet_sim

    from gpuledger.store import Ledger, accounts
    from gpuledger.store.series_tier import open_store

    tag = uuid.uuid4().hex[:10]
    ledger_schema, store_schema = f"fleet_serve_{tag}", f"fleet_series_{tag}"
    work = Path(tempfile.mkdtemp(prefix="fleet-serve-"))
    db = _schema_url(ledger_schema)
    series = f"{PG}?schema={store_schema}" if args.store == "postgres" else f"chdb://{work}/series"
    replicas: list[Replica] = []
    try:
        with Ledger(db, migrate=True) as led:
            accounts.add_project(led, "fleet", actor="bench")
            token = accounts.issue_token(led, "sim-agent", role="agent", projects=["fleet"], actor="bench",
                                         create_user=True)[1]  # fmt: skip
        start = int(time.time() // 60) * 60 - 6 * 3600  # room for 360 minutes a run, none in the future
        fleet = fleet_sim.Fleet(args.agents * 8, start)
        agents = [Agent(i, fleet, start) for i in range(args.agents)]
        replicas = [
            Replica(db, series, work, f"r{i}", live=not args.no_live, only=args.series_only)
            for i in range(args.replicas)
        ]
        if not args.no_live:  # as serve does before its workers start
            open_store(series).close()
        for r in replicas:
            r.start()
        load_before = _load()
        for r in replicas:
            r.mark()
        pg_before = _pg_cpu(replicas)
        out: dict[str, Any] = {"lat": [], "acked": 0, "failed": 0}
        t_begin = time.time()
        until = t_begin + args.seconds
        threads = [
            threading.Thread(target=_send, args=(agents[k :: args.senders], replicas, token, until, out))
            for k in range(args.senders)
        ]
        for t in threads:
            t.start()
        killed_at = None
        if not args.no_kill:
            time.sleep(args.seconds / 2)
            replicas[0].kill()
            killed_at = time.time() - t_begin
            if args.replicas == 1:
                replicas[0].start()  # the same replica again: its agents wait for it
                replicas[0].cpu_mark = replicas[0].cpu_s()
        for t in threads:
            t.join()
        wall = time.time() - t_begin
        load_after = _load()
        server_cpu = sum(r.spent() for r in replicas)
        pg_after = _pg_cpu(replicas)
        pg_cpu = sum(t - pg_before.get(pid, 0.0) for pid, t in pg_after.items())
        for r in replicas:
            r.stop()
        checked = check(agents, fleet, db, None if args.no_live else series, args.series_only)
        lat = sorted(out["lat"])
        q = statistics.quantiles(lat, n=100) if len(lat) >= 2 else [lat[0] * 1000] * 99
        report = {
            "agents": args.agents, "gpus": args.agents * 8, "replicas": args.replicas, "store": args.store,
            "live": not args.no_live, "series_only": args.series_only, "senders": args.senders,
            "wall_s": round(wall, 1),
            "killed_at_s": killed_at and round(killed_at, 1),
            "pushes": len(lat), "failed_pushes": out["failed"], "intervals_acked": out["acked"],
            "intervals_per_s": round(out["acked"] / wall), "p50_ms": round(q[49] * 1000, 1),
            "p99_ms": round(q[98] * 1000, 1),
            "server_cpu_ms_per_push": round(server_cpu * 1000 / max(1, len(lat)), 2),
            "pg_backend_cpu_ms_per_push": round(pg_cpu * 1000 / max(1, len(lat)), 2),
            "runs": checked["runs"], "intervals_checked": checked["intervals"],
            "lost_or_doubled_ledger": len(checked["bad_ledger"]), "lost_or_doubled_store": len(checked["bad_store"]),
            "store_b_per_interval": round(checked["store_bytes"] / max(1, checked["intervals"]), 1),
            "ledger_b_per_interval": round(checked["ledger_bytes"] / max(1, checked["intervals"]), 1),
            # series_segments + series_day_sums + series_only_runs (empty unless --series-only)
            "ledger_only_tables_b_per_interval": round(checked["only_bytes"] / max(1, checked["intervals"]), 1),
            "load_before": load_before, "load_after": load_after,
        }  # fmt: skip
        print(json.dumps(report, indent=1))
        for bad in (checked["bad_ledger"] + checked["bad_store"])[:5]:
            print("MISMATCH", bad)
        if checked["bad_ledger"] or checked["bad_store"]:
            raise SystemExit(1)
    finally:
        for r in replicas:
            r.kill()
        if not args.keep:
            _drop_schemas(ledger_schema, store_schema)
            import shutil

            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
