"""Ingestion through the HTTP API into PostgreSQL from several concurrent agents, beside MLflow's
tracking server ingesting the same number of values with log_batch, in the same run (issue 6).

    python benchmarks/ingest.py [--agents 4] [--batches 25] [--batch-intervals 5000] [--workers 2]
                                [--mlflow-values-per-interval 1] [--skip-mlflow] [--unsigned] [--final]
                                [--rounds 1] [--burners 0]

MLflow's side needs mlflow-skinny, flask-cors and alembic, best in a virtualenv of their own that
sees this one's packages (so they cannot change the versions gpuledger is tested with), e.g.
``python -m venv /tmp/mlvenv``, a ``.pth`` file there holding ``import site;
site.addsitedir('<this venv's site-packages>')``, ``/tmp/mlvenv/bin/pip install mlflow-skinny
flask-cors alembic``, then run this script with ``/tmp/mlvenv/bin/python``.
``--rounds R`` runs both systems R times, the order swapped every round, and prints min / median /
max of each figure and of the same-round ratio; ``--burners N`` keeps N extra processes spinning
on the CPU for the whole call (a loaded machine), and the load average is printed per round.

gpuledger: ``gpuledger serve --workers W`` on a fresh schema; each agent (a process: one machine)
posts ``--batches`` batches of ``--batch-intervals`` GPU intervals (8 GPUs, 5 s intervals, every
field measured; the compact ``gpu_rows`` form agents send) of its own run to POST /api/v1/ingest.
Bodies are serialised before the clock
starts, for both systems, so the figures are the servers' (and PostgreSQL's) work. MLflow: the
Flask tracking app (``mlflow.server:app``, under uvicorn's WSGI interface with the same number of
workers, on PostgreSQL) receives POST /api/2.0/mlflow/runs/log-batch with 1,000 metric values per
request (its limit), one run per agent. By default MLflow gets one value per gpuledger interval;
``--mlflow-values-per-interval`` K sends K (an interval carries about a dozen numbers).
Printed: values/s, intervals/s, bytes stored per interval / value, p50/p95 push latency.

The audit trail is signed, as on a real server: a fresh Ed25519 key in ``GPULEDGER_AUDIT_KEY`` for
the accounts set-up and the server (``--unsigned``: no key). ``--final`` makes each agent's last
batch the run's final one, so the server also seals the run (recomputing its 125,000 intervals).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import httpx
import orjson
import psutil
import psycopg
from _common import machine_line, median, p95, source_state, version

from gpuledger.core.wire import GPU_COLUMNS

PG = os.environ.get("GPULEDGER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
GPUS = 8
START = time.time() - 36 * 3600  # 21.7 h of intervals per run, all in a month still open (closed months refuse runs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _schema(name: str) -> str:
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    return name


def _drop(name: str) -> None:
    with contextlib.suppress(Exception), psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _url(schema: str, driver: str = "postgresql+psycopg") -> str:
    return PG.replace("postgresql://", f"{driver}://", 1) + f"?options=-csearch_path%3D{schema}"


def _wait(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.3)
    raise SystemExit(f"{url} did not answer in {timeout_s:.0f} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


# -- bodies ------------------------------------------------------------------------------------


def interval(gpu: int, seq: int) -> dict[str, Any]:
    t0 = START + seq * 5.0
    return {
        "device_uuid": f"GPU-{gpu:02d}-5f1c9a7e", "seq": seq, "t0": t0, "t1": t0 + 5.0, "samples": 5,
        "busy_s": 4.1 + (seq % 9) * 0.01, "util_method": "samples", "util_max_pct": 97.0, "energy_j": 1502.5 + seq % 7,
        "energy_method": "counter", "power_max_w": 312.0, "mem_used_max_b": 61_000_000_000 + seq,
        "mem_used_last_b": 60_900_000_000, "temp_max_c": 64.0, "sm_clock_avg_mhz": 1410.0, "mem_clock_max_mhz": 1593.0,
        "throttle_s": {"power": 0.2},
    }  # fmt: skip


VALUES_PER_INTERVAL = sum(
    1 for k, v in interval(0, 0).items() if isinstance(v, (int, float)) and k not in ("seq", "t0", "t1")
) + len(interval(0, 0)["throttle_s"])


def gpuledger_bodies(run_id: str, batches: int, per_batch: int, final: bool = False) -> list[bytes]:
    per_gpu = per_batch // GPUS
    run = {"id": run_id, "command": ["python", "train.py"], "user": "bench", "host": f"node-{run_id[:8]}", "cwd": "/",
           "started_at": START, "labels": {"project": "bench", "team": "perf"}}  # fmt: skip
    devices = [{"index": g, "uuid": f"GPU-{run_id[:8]}-{g:02d}", "name": "NVIDIA A100-SXM4-80GB"} for g in range(GPUS)]
    out = []
    for b in range(batches):
        rows = [interval(g, b * per_gpu + i) | {"device_uuid": f"GPU-{run_id[:8]}-{g:02d}"} for g in range(GPUS)
                for i in range(per_gpu)]  # fmt: skip
        body: dict[str, Any] = {"run": run, "gpu_rows": [[r.get(c) for c in GPU_COLUMNS] for r in rows]}
        if b == 0:
            body["devices"] = devices
        if final and b == batches - 1:
            end = START + (b + 1) * per_gpu * 5.0
            body["run"] = run | {"status": "succeeded", "ended_at": end, "exit_code": 0}
            body["final"] = True
        out.append(orjson.dumps(body))
    return out


def mlflow_bodies(run_id: str, values: int) -> list[bytes]:
    out, sent = [], 0
    while sent < values:
        n = min(1000, values - sent)
        metrics = [
            {"key": f"gpu{k % GPUS}.busy_s", "value": 4.1 + k % 9 * 0.01, "timestamp": int(START * 1000) + k * 5000,
             "step": k // GPUS}
            for k in range(sent, sent + n)
        ]  # fmt: skip
        out.append(orjson.dumps({"run_id": run_id, "metrics": metrics}))
        sent += n
    return out


# -- CPU accounting --------------------------------------------------------------------------


class CpuMeter(threading.Thread):
    """CPU seconds used by the server's process tree and its PostgreSQL backends (found by their
    application_name), sampled while the agents push: a figure that does not depend on how busy
    the rest of the shared machine is."""

    def __init__(self, server_pid: int, app_name: str) -> None:
        super().__init__(daemon=True)
        self.server_pid, self.app_name = server_pid, app_name
        self.first: dict[int, float] = {}
        self.last: dict[int, tuple[str, float]] = {}
        self.stop_flag = threading.Event()

    def _sample(self) -> None:
        pids: dict[int, str] = {}
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.server_pid)
            pids |= {p.pid: "server" for p in [root, *root.children(recursive=True)]}
        with contextlib.suppress(Exception), psycopg.connect(PG, autocommit=True) as conn:
            q = "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
            pids |= {r[0]: "postgres" for r in conn.execute(q, (self.app_name,))}
        for pid, kind in pids.items():
            with contextlib.suppress(psutil.Error):
                t = psutil.Process(pid).cpu_times()
                used = t.user + t.system
                self.first.setdefault(pid, used)
                self.last[pid] = (kind, used)

    def run(self) -> None:
        while not self.stop_flag.wait(0.25):
            self._sample()

    def totals(self) -> dict[str, float]:
        self.stop_flag.set()
        self.join()
        self._sample()
        out = {"server": 0.0, "postgres": 0.0}
        for pid, (kind, used) in self.last.items():
            out[kind] += used - self.first[pid]
        return out


# -- agents ------------------------------------------------------------------------------------


def agent(url: str, headers: dict[str, str], bodies: list[bytes], go: Any, results: Any) -> None:
    latencies = []
    with httpx.Client(timeout=300, headers={"Content-Type": "application/json", **headers}) as http:
        go.wait()
        for body in bodies:
            t = time.perf_counter()
            r = http.post(url, content=body)
            latencies.append(time.perf_counter() - t)
            if r.status_code != 200:
                results.put(("error", f"{r.status_code}: {r.text[:300]}"))
                return
    results.put(("ok", latencies))


def drive(
    url: str, headers: dict[str, str], per_agent: list[list[bytes]], meter: CpuMeter | None = None
) -> tuple[float, list[float], dict[str, float]]:
    ctx = mp.get_context("fork")
    go, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=agent, args=(url, headers, b, go, results)) for b in per_agent]
    for p in procs:
        p.start()
    time.sleep(1.0)  # every agent connected and waiting
    if meter is not None:
        meter._sample()
        meter.start()
    t = time.perf_counter()
    go.set()
    latencies: list[float] = []
    for _ in procs:
        kind, value = results.get(timeout=1800)
        if kind == "error":
            raise SystemExit(f"push failed: {value}")
        latencies += value
    wall = time.perf_counter() - t
    cpu = meter.totals() if meter is not None else {}
    for p in procs:
        p.join()
    return wall, latencies, cpu


def relation_bytes(schema: str, tables: list[str]) -> int:
    with psycopg.connect(_url(schema, "postgresql")) as conn:
        return sum(conn.execute("SELECT pg_total_relation_size(%s)", (t,)).fetchone()[0] for t in tables)


def count(schema: str, table: str) -> int:
    with psycopg.connect(_url(schema, "postgresql")) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


# -- the two systems ---------------------------------------------------------------------------


def bench_gpuledger(args: argparse.Namespace) -> dict[str, Any]:
    from gpuledger.store import Ledger, accounts

    schema = _schema(f"gl_bench_{uuid.uuid4().hex[:10]}")
    app_name = f"gl-bench-{schema[-10:]}"
    url = _url(schema) + f"&application_name={app_name}"
    try:
        subprocess.run(
            [sys.executable, "-m", "gpuledger", "db", "migrate", "--db", url], check=True, capture_output=True
        )
        if args.experiment_no_interval_fk:  # what the per-row foreign-key check costs (not the shipped schema)
            with psycopg.connect(_url(schema, "postgresql"), autocommit=True) as conn:
                conn.execute("ALTER TABLE gpu_intervals DROP CONSTRAINT gpu_intervals_run_id_fkey")
        with Ledger(url, migrate=False) as led:
            accounts.add_project(led, "bench", actor="bench")
            token = accounts.issue_token(
                led, "bench-agent", role="agent", projects=["bench"], actor="bench", create_user=True
            )[1]
        port = _free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuledger", "serve", "--db", url, "--port", str(port),
             "--workers", str(args.workers),
             "--log-level", "warning", *(["--unsigned"] if args.unsigned else [])], start_new_session=True,
        )  # fmt: skip
        try:
            _wait(f"http://127.0.0.1:{port}/healthz", proc, 60)
            per_agent = [
                gpuledger_bodies(str(uuid.uuid4()), args.batches, args.batch_intervals, args.final)
                for _ in range(args.agents)
            ]
            body_b = sum(len(b) for bs in per_agent for b in bs)
            meter = CpuMeter(proc.pid, app_name)
            wall, lat, cpu = drive(
                f"http://127.0.0.1:{port}/api/v1/ingest", {"Authorization": f"Bearer {token}"}, per_agent, meter
            )
        finally:
            _stop(proc)
        rows = count(schema, "gpu_intervals")
        expected = args.agents * args.batches * (args.batch_intervals // GPUS) * GPUS
        assert rows == expected, (rows, expected)
        size = relation_bytes(schema, ["gpu_intervals"])
        return {"rows": rows, "wall": wall, "lat": lat, "bytes": size, "wire_b": body_b, "cpu": cpu}
    finally:
        if not args.keep:
            _drop(schema)


def bench_mlflow(args: argparse.Namespace, values: int) -> dict[str, Any]:
    schema = _schema(f"mlf_bench_{uuid.uuid4().hex[:10]}")
    port = _free_port()
    env = dict(
        os.environ, _MLFLOW_SERVER_FILE_STORE=_url(schema), _MLFLOW_SERVER_ARTIFACT_ROOT="/tmp/gl-bench-mlflow-art"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "mlflow.server:app", "--interface", "wsgi", "--host", "127.0.0.1",
         "--port", str(port), "--workers", str(args.workers), "--log-level", "warning"],
        env=env, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(base + "/health", proc, 300)  # the first start creates MLflow's schema (alembic)
        exp = httpx.post(base + "/api/2.0/mlflow/experiments/create", json={"name": "bench"}, timeout=120).json()
        per_agent_values = values // args.agents
        per_agent = []
        for _ in range(args.agents):
            run = httpx.post(base + "/api/2.0/mlflow/runs/create",
                             json={"experiment_id": exp["experiment_id"], "start_time": int(START * 1000)},
                             timeout=120)  # fmt: skip
            per_agent.append(mlflow_bodies(run.json()["run"]["info"]["run_id"], per_agent_values))
        wall, lat, _ = drive(base + "/api/2.0/mlflow/runs/log-batch", {}, per_agent)
        rows = count(schema, "metrics")
        size = relation_bytes(schema, ["metrics", "latest_metrics"])
        return {"rows": rows, "wall": wall, "lat": lat, "bytes": size}
    finally:
        _stop(proc)
        if not args.keep:
            _drop(schema)


def burn() -> None:
    """A CPU burner (--burners): one core's worth of pure-Python work until it is killed."""
    while True:
        pass


def one_round(args: argparse.Namespace, order: tuple[str, ...]) -> dict[str, float]:
    """gpuledger and (unless --skip-mlflow) MLflow, in ``order``; this round's figures."""
    out: dict[str, float] = {}
    for system in order:
        if system == "gpuledger":
            g = bench_gpuledger(args)
            g_rate = g["rows"] / g["wall"]
            print(
                f"gpuledger: {g['rows']:,} intervals ({g['rows'] * VALUES_PER_INTERVAL:,} values) from {args.agents} "
                f"agents in {g['wall']:.2f} s = {g_rate:,.0f} intervals/s = {g_rate * VALUES_PER_INTERVAL:,.0f} "
                f"values/s; {g['bytes'] / g['rows']:.0f} bytes stored per interval "
                f"({g['bytes'] / g['rows'] / VALUES_PER_INTERVAL:.0f} per value); "
                f"wire {g['wire_b'] / g['rows']:.0f} B/interval; push latency p50 {median(g['lat']) * 1000:.0f} ms, "
                f"p95 {p95(g['lat']) * 1000:.0f} ms ({args.batch_intervals} intervals per push)",
                flush=True,
            )
            cpu = g["cpu"]
            per = (cpu["server"] + cpu["postgres"]) / g["rows"] * 1e6
            print(
                f"gpuledger CPU: server {cpu['server']:.1f} s + its PostgreSQL backends {cpu['postgres']:.1f} s = "
                f"{per:.1f} CPU-us per interval (two idle cores would take {2e6 / per:,.0f} intervals/s)",
                flush=True,
            )
            out.update(gl_rate=g_rate, gl_cpu_us=per, gl_rows=g["rows"])
        else:
            m = bench_mlflow(args, int(out.get("gl_rows", args.agents * args.batches * args.batch_intervals))
                             * args.mlflow_values_per_interval)  # fmt: skip
            m_rate = m["rows"] / m["wall"]
            print(
                f"MLflow:    {m['rows']:,} values from {args.agents} agents in {m['wall']:.2f} s = {m_rate:,.0f} "
                f"values/s; {m['bytes'] / m['rows']:.0f} bytes stored per value; push latency p50 "
                f"{median(m['lat']) * 1000:.0f} ms, p95 {p95(m['lat']) * 1000:.0f} ms (1,000 values per push)",
                flush=True,
            )
            out.update(ml_rate=m_rate)
    if "ml_rate" in out:
        out["ratio"] = out["gl_rate"] / out["ml_rate"]
        print(
            f"ratio: {out['ratio']:.1f}x records/s (an interval vs a value), "
            f"{out['ratio'] * VALUES_PER_INTERVAL:.0f}x values/s",
            flush=True,
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--batches", type=int, default=25)
    ap.add_argument("--batch-intervals", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--mlflow-values-per-interval", type=int, default=1)
    ap.add_argument("--skip-mlflow", action="store_true")
    ap.add_argument("--unsigned", action="store_true", help="No audit key (the trail hash-chained only).")
    ap.add_argument("--final", action="store_true", help="Each agent's last batch ends and seals its run.")
    ap.add_argument("--keep", action="store_true", help="Keep the benchmark schemas.")
    ap.add_argument("--rounds", type=int, default=1, help="Rounds of both systems, the order swapped every round.")
    ap.add_argument("--burners", type=int, default=0, help="Processes that each keep a core busy throughout.")
    ap.add_argument(
        "--experiment-no-interval-fk", action="store_true",
        help="Drop the gpu_intervals -> runs foreign key first, to measure what its per-row check costs.",
    )  # fmt: skip
    args = ap.parse_args()

    print(machine_line())
    print(source_state())
    print(f"gpuledger {version('gpuledger')}; mlflow-skinny {version('mlflow-skinny')}; PostgreSQL at {PG}")
    if not args.unsigned:  # the set-up here and the server process both sign the audit trail
        from gpuledger.core.audit.signing import SigningKey

        key = SigningKey.generate()
        os.environ["GPULEDGER_AUDIT_KEY"] = key.text
        print(f"audit trail signed with Ed25519 key {key.key_id}" + ("; runs end and are sealed" if args.final else ""))
    burners = [mp.Process(target=burn, daemon=True) for _ in range(args.burners)]
    for b in burners:
        b.start()
    if burners:
        print(f"{len(burners)} CPU burners running (pids {', '.join(str(b.pid) for b in burners)})")
    rounds = []
    try:
        for r in range(args.rounds):
            order = ("gpuledger",) if args.skip_mlflow else (("gpuledger", "mlflow"), ("mlflow", "gpuledger"))[r % 2]
            print(f"-- round {r + 1} ({' then '.join(order)}); load average {_load()}", flush=True)
            rounds.append(one_round(args, order))
    finally:
        for b in burners:
            b.kill()
            b.join()
    print(f"load average at the end: {_load()}")
    if len(rounds) > 1:
        print(f"{len(rounds)} rounds, min / median / max:")
        for key, what, fmt in (("gl_rate", "gpuledger intervals/s", ",.0f"), ("gl_cpu_us", "gpuledger CPU-us per "
                               "interval", ".1f"), ("ml_rate", "MLflow values/s", ",.0f"), ("ratio", "ratio, records",
                               ".1f")):  # fmt: skip
            xs = [r[key] for r in rounds if key in r]
            if xs:
                print(f"  {what:30} {min(xs):{fmt}} / {median(xs):{fmt}} / {max(xs):{fmt}}")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
