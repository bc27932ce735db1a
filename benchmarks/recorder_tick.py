"""Recorder CPU per sample, side by side with MLflow's system-metrics monitor (issue 2).

    python benchmarks/recorder_tick.py [--ticks 30] [--rounds 2] [--quick] [--profile VARIANT] [--driver-us US]
                                     [--baseline DIR [--together]]

Variants, each in a fresh process of its own whose main thread only waits, run in turn
(A B C, then B C A, ...) while one shared tree of 8 busy-ish processes runs on the machine:

  gl-host   gpuledger's real Recorder loop (1 s tick, 5 s interval, flush every 10 s) over a
            ProcessTreeCollector of that tree, writing into a real SQLite Ledger (sink = Ledger.append).
  gl-gpu8   the same plus 8 scripted GPUs: NvmlCollector over FakeNvml (8 devices, 2 processes each,
            one of them the run's), as `gpuledger run --replay-gpus` does.
  gl-nvml   the same as gl-host plus this machine's own GPUs: NvmlCollector over the real driver
            (nvidia-ml-py), as `gpuledger run` builds it; every query costs what the driver makes it
            cost. Needs a GPU; start some GPU work beside it, or the driver has little to answer.
  mlflow    mlflow.system_metrics SystemMetricsMonitor, sampling_interval=1 s,
            samples_before_logging=1 (every sample is logged), tracking URI sqlite:/// in a temp dir.
            It reads host counters only (CPU %, memory, disk usage, network): it meters no process
            tree, and no GPU here (NVML cannot load on this machine).

CPU per sample is the sampler thread's own CPU clock (CLOCK_THREAD_CPUTIME_ID) from the start
of one sample to the start of the next: the sample, the sleep, closing intervals and writing, all in
the real loop. Where the recorder writes in a thread of its own (gpuledger since 2026-12-03, so a
slow ledger never delays a reading), that thread's CPU clock over the same span is added: the
figure is all of the recorder's work, in whichever thread. The process's CPU over the same span
(getrusage RUSAGE_SELF; the main thread sleeps) is printed as a cross-check. The first --warmup
samples of each process are not counted.
Phases (host read, GPU read, merge, write; MLflow: collect, run-status check, publish) are timed
with the same thread clock around those calls; the cyclic garbage collector's passes in the sampler
thread are timed too (gc.callbacks), by generation, inside whichever phase they struck. --profile
VARIANT runs one variant under cProfile (slower, not timed) and prints where the time goes.

--baseline DIR also runs the gpuledger variants on the source tree DIR (its src/, this script's
harness), in turn with this tree's in every round, and prints the ratio round by round: the same
run, as a change's CPU cost must be compared on a noisy machine. With 4 rounds or more it also
prints a 95 % bootstrap interval of the mean ratio (the rounds resampled, as the machine's noise
moves whole rounds): a difference is shown only when the interval leaves 1. For the GPU variant
the baseline needs this tree's scripted NVML, so both read the same answers::

    git worktree add /tmp/base 85532be
    cp src/gpuledger/collect/fake_nvml*.py /tmp/base/src/gpuledger/collect/
    python benchmarks/recorder_tick.py --variants gl-gpu8 --baseline /tmp/base --rounds 6

--together runs a round's variants at the same time instead of in turn, each started half a tick
after the one before (so no two sample at the same instant). Run in turn, each variant meets a
different minute of the machine, and on a shared VM whole minutes run 1.5x slower than others; run
together, they meet the same ones, so the round-to-round spread of the ratio shrinks and a smaller
difference can be told from noise. The variants then share the machine with one another (as two
collectors on one node would), alike for all of them.

--driver-us US makes each scripted NVML query also spend US microseconds of the thread's CPU, as a
query into a real driver does (an ioctl and the driver's work; public figures run from about 22 µs
to a few hundred per query), counted as "scripted driver". The scripted driver's own cost is
Python's, nothing like a driver's, so a collector that makes fewer queries but does more of its
own work is only compared fairly with a driver cost; 0 (the default) leaves it out.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The tree measured: this one's src/, or a baseline's (--src, given to the child processes).
_SRC = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv[:-1] else None
sys.path.insert(1, _SRC or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from _common import machine_line, median, p95, source_state, start_tree, stop_tree, version  # noqa: E402

VARIANTS = {
    "gl-host": "gpuledger (a) host + tree of 8",
    "gl-gpu8": "gpuledger (b) (a) + 8 fake GPUs",
    "gl-nvml": "gpuledger (c) (a) + real NVML GPUs",
    "mlflow": "MLflow SystemMetricsMonitor",
}
GL_PHASES = ("host read", "gpu read", "merge", "write")
GL_SUBPHASES = {  # part of
    "tree scan": "host read",
    "host counters": "host read",
    "scripted driver": "gpu read",
    "run check": "write",
}
MLFLOW_PHASES = ("collect", "status check", "publish")
STAGGER_S = 0.5  # --together: half of the recorder's 1 s tick between one variant's start and the next


# -- measuring inside a child process ----------------------------------------------------------


class Meter:
    """Per-sample CPU of one sampler thread, split into named phases, plus the CPU of the threads
    it hands work to (``watch``: gpuledger's writer), so all of a recorder's work is counted
    whichever thread does it."""

    def __init__(self, samples: int, warmup: int = 0, profile: Any = None) -> None:
        self.wanted = samples + 1  # n samples are the spans between n + 1 sample starts
        self.warmup = warmup
        self.profile = profile  # a cProfile.Profile, run over the counted samples only
        self.done = threading.Event()
        self.rows: list[dict[str, Any]] = []
        self._ident: int | None = None
        self._cur: dict[str, int] = defaultdict(int)
        self._last: tuple[int, float] | None = None
        self._depth: dict[str, int] = defaultdict(int)
        self._gc_t0 = 0
        self._watched: dict[int, int] = {}  # thread ident -> its CPU clock id
        self._watched_ns: dict[int, int] = {}  # thread ident -> its CPU at the last mark

    def watch(self, thread: threading.Thread) -> None:
        """Count ``thread``'s CPU in every sample from now on, and time phases that run in it."""
        assert thread.ident is not None
        self._watched[thread.ident] = time.pthread_getcpuclockid(thread.ident)

    def _watched_delta(self) -> int:
        """CPU the watched threads spent since the previous mark (a thread's first mark: 0)."""
        delta = 0
        for ident, clock in list(self._watched.items()):
            try:
                now = time.clock_gettime_ns(clock)
            except OSError:  # the thread ended (at stop, after the counted samples)
                continue
            delta += now - self._watched_ns.get(ident, now)
            self._watched_ns[ident] = now
        return delta

    def mark(self) -> None:
        """Called at the start of every sample, in the sampler thread."""
        self._ident = threading.get_ident()
        now = time.thread_time_ns()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        proc = ru.ru_utime + ru.ru_stime
        others = self._watched_delta()
        if self._last is not None and not self.done.is_set():
            t0, p0 = self._last
            self.rows.append({"cpu_ns": now - t0 + others, "proc_s": proc - p0, "phases": dict(self._cur)})
            if len(self.rows) + 1 >= self.wanted:
                if self.profile is not None:
                    self.profile.disable()
                self.done.set()
            elif self.profile is not None and len(self.rows) == self.warmup:
                self.profile.enable()  # profiles this thread only
        self._cur.clear()
        self._last = (time.thread_time_ns(), proc)  # after our own bookkeeping

    def gc_event(self, phase: str, info: dict[str, Any]) -> None:
        """gc.callbacks hook: the sampler thread's CPU in the collector's passes, by generation."""
        if threading.get_ident() != self._ident:
            return
        if phase == "start":
            self._gc_t0 = time.thread_time_ns()
        elif self._gc_t0:
            self._cur[f"gc gen {info.get('generation')}"] += time.thread_time_ns() - self._gc_t0
            self._gc_t0 = 0

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ident = threading.get_ident()
            if ident != self._ident and ident not in self._watched:
                return fn(*args, **kwargs)  # priming and the final flush run in the main thread
            t0 = time.thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self._cur[name] += time.thread_time_ns() - t0

        return wrapper

    def timed_outer(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Like ``timed``, but a call made from inside another call of ``name`` is not counted twice."""
        depth = self._depth

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if depth[name] or threading.get_ident() != self._ident:
                return fn(*args, **kwargs)
            depth[name] += 1
            t0 = time.thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self._cur[name] += time.thread_time_ns() - t0
                depth[name] -= 1

        return wrapper


def time_driver(fake: Any, meter: Meter, cost_us: float = 0.0) -> None:
    """Time every device query of the scripted NVML as "scripted driver": the part of the GPU read
    that real hardware replaces with its own calls into the driver. The rest is gpuledger's own work.
    ``cost_us``: each query also spends that much of the thread's CPU (--driver-us)."""
    for name in dir(fake):
        fn = getattr(fake, name, None)
        if name.startswith("nvmlDevice") and callable(fn):
            setattr(fake, name, meter.timed_outer("scripted driver", with_cpu_cost(fn, cost_us)))


def with_cpu_cost(fn: Callable[..., Any], cost_us: float) -> Callable[..., Any]:
    """``fn`` that also burns ``cost_us`` of this thread's CPU, as a query into a real driver does
    (an ioctl, the driver's own work); nested queries are charged once."""
    if cost_us <= 0:
        return fn
    cost_ns, depth = int(cost_us * 1000), [0]

    def call(*args: Any, **kwargs: Any) -> Any:
        depth[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            depth[0] -= 1
            if depth[0] == 0:  # on top of the scripted answer's own cost
                end = time.thread_time_ns() + cost_ns
                while time.thread_time_ns() < end:
                    pass

    return call


def fake_gpus(n: int, seconds: int = 3600, seed: int = 7) -> list[Any]:
    """n scripted A100s: a point a second (utilisation, memory, power, clocks, a throttle now and
    then), two processes each: the run's and another user's."""
    from gpuledger.collect.fake_nvml import FakeGpu, TracePoint

    rnd = random.Random(seed)
    gib = 2**30
    gpus = []
    for i in range(n):
        points = [
            TracePoint(
                float(t),
                util_pct=rnd.choice([0, 35, 90, 97, 100]),
                mem_used_b=(20 + t % 40) * gib,
                power_w=rnd.uniform(90, 390),
                temp_c=40 + t % 30,
                sm_clock_mhz=1410,
                mem_clock_mhz=1593,
                throttle=("power",) if t % 17 == 0 else (),
                procs={"run": (18 * gib, 85.0), 90000 + i: (2 * gib, 5.0)},
            )
            for t in range(seconds)
        ]
        gpus.append(FakeGpu(f"GPU-{i:08d}-bench", points=points, pci_bus_id=f"00000000:{i + 7:02X}:00.0"))
    return gpus


def child_gpuledger(variant: str, root: int, meter: Meter, tmp: str, driver_us: float = 0.0) -> dict[str, Any]:
    from gpuledger.collect.fake_nvml import FakeNvml
    from gpuledger.collect.host import ProcessTreeCollector
    from gpuledger.collect.nvml import NvmlCollector
    from gpuledger.collect.replay import ReplayCollector
    from gpuledger.core.ids import uuid7
    from gpuledger.core.model import RunRecord
    from gpuledger.recorder import recorder as rec_mod
    from gpuledger.store import Ledger, writes

    # Phase timers on the merge functions the recorder module imported (this process only).
    rec_mod.merge_gpu_ticks = meter.timed("merge", rec_mod.merge_gpu_ticks)
    rec_mod.merge_host_ticks = meter.timed("merge", rec_mod.merge_host_ticks)
    if hasattr(writes, "require_run"):  # the SELECT that checks the run exists before each append
        writes.require_run = meter.timed("run check", writes.require_run)

    class TimedRecorder(rec_mod.Recorder):
        def tick(self, *args: Any, **kwargs: Any) -> None:
            if threading.current_thread() is not threading.main_thread():
                meter.mark()
            super().tick(*args, **kwargs)

    class TimedHost(ProcessTreeCollector):
        read = meter.timed("host read", ProcessTreeCollector.read)
        if hasattr(ProcessTreeCollector, "_scan"):  # private: timed where it exists
            _scan = meter.timed("tree scan", ProcessTreeCollector._scan)

    # As gpuledger run builds it: host-wide counters once per interval (ticks_per_interval).
    host = TimedHost(root, include_root=True, system_every=rec_mod.ticks_per_interval(5.0))
    system = getattr(host, "_system", None)
    if system is not None and hasattr(system, "read"):
        system.read = meter.timed("host counters", system.read)
    gpu = None
    if variant == "gl-gpu8":
        fake = FakeNvml(fake_gpus(8), clock=time.time, start=time.time())
        time_driver(fake, meter, driver_us)
        gpu = ReplayCollector(fake, NvmlCollector(nvml=fake, clock=time.time, source="replay"))
        gpu.read = meter.timed("gpu read", gpu.read)  # type: ignore[method-assign]
    elif variant == "gl-nvml":
        # No wrapper around the driver's calls: it would cost more for the tree that makes more.
        gpu = NvmlCollector()
        if not gpu.devices():
            raise SystemExit("gl-nvml: NVML found no GPU on this machine")
        gpu.read = meter.timed("gpu read", gpu.read)  # type: ignore[method-assign]

    ledger = Ledger(f"sqlite:///{tmp}/ledger.db")
    now = time.time()
    run = RunRecord(
        id=uuid7(int(now * 1000)), command=["bench"], user="bench", host="bench", cwd=tmp, started_at=now,
        interval_s=5.0, replayed=variant == "gl-gpu8",
    )  # fmt: skip
    ledger.create_run(run)
    if gpu is not None:
        ledger.add_devices(run.id, gpu.devices())
    sink = meter.timed("write", lambda g, h, e, m: ledger.append(run.id, g, h, e, m))

    rec = TimedRecorder(sink, host=host, gpu=gpu, interval_s=5.0)
    rec.start()
    writer = getattr(rec, "_writer", None)  # where the recorder writes in a thread of its own
    if writer is not None:
        meter.watch(writer)
    meter.done.wait()
    rec.stop()
    n_gpu = len(ledger.gpu_intervals(run.id))
    n_host = len(ledger.host_intervals(run.id))
    procs = max((h.procs_max or 0) for h in ledger.host_intervals(run.id)) if n_host else 0
    ledger.close()
    return {
        "settings": f"interval {rec.interval_s:g} s, tick {rec.tick_s:g} s, "
        f"flush every {getattr(rec, '_flush_every_s', float('nan')):g} s",
        "written": f"{n_host} host + {n_gpu} GPU intervals; tree of {procs} processes; host reader {host.backend}",
    }


def child_mlflow(meter: Meter, tmp: str) -> dict[str, Any]:
    for var in ("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING"):
        os.environ.pop(var, None)
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    from mlflow.tracking.client import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    uri = f"sqlite:///{tmp}/mlflow.db"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("bench"))
    # The monitor checks the run's status after every sample (MlflowClient(...).get_run).
    MlflowClient.get_run = meter.timed("status check", MlflowClient.get_run)  # type: ignore[method-assign]

    class TimedMonitor(SystemMetricsMonitor):
        def collect_metrics(self) -> Any:
            meter.mark()
            return meter.timed("collect", super().collect_metrics)()

        def publish_metrics(self, metrics: Any) -> Any:
            return meter.timed("publish", super().publish_metrics)(metrics)

    mon = TimedMonitor(run.info.run_id, sampling_interval=1, samples_before_logging=1, tracking_uri=uri)
    mon.start()
    meter.done.wait()
    mon.finish()
    client.set_terminated(run.info.run_id)
    logged = client.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")
    return {
        "settings": f"sampling_interval {mon.sampling_interval:g} s, samples_before_logging "
        f"{mon.samples_before_logging}, tracking {uri.split(':')[0]}; monitors "
        + ", ".join(type(m).__name__ for m in mon.monitors),
        "written": f"{len(logged)} logged steps of system/* metrics",
    }


def print_by_module(stats: Any, samples: int) -> None:
    """Own time (tottime) summed per source file: which layer the CPU goes to."""
    per: dict[str, float] = defaultdict(float)
    for (path, _line, func), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():
        if path == "~":  # a builtin: name it by what it does
            key = "builtins: " + ("sqlite3" if "sqlite3" in func else "posix I/O" if "posix" in func else "other")
        else:
            parts = path.replace("\\", "/").split("/")
            if "site-packages" in parts:
                key = parts[parts.index("site-packages") + 1]
            elif "gpuledger" in parts:
                key = "gpuledger/" + "/".join(parts[parts.index("gpuledger") + 1 :])
            else:
                key = parts[-1]
        per[key] += tottime
    total = sum(per.values())
    print(f"== own CPU per source file (ms per sample, under the profiler; total {1e3 * total / samples:.2f}) ==")
    for key, t in sorted(per.items(), key=lambda kv: -kv[1])[:20]:
        print(f"  {1e3 * t / samples:7.3f}  {100 * t / total:5.1f} %  {key}")


def child(args: argparse.Namespace) -> None:
    import cProfile
    import pstats

    # CPU time of this thread, not wall time: sleeping and waiting for a core must not count.
    profile = cProfile.Profile(time.thread_time) if args.profile else None
    meter = Meter(args.warmup + args.ticks, args.warmup, profile)
    gc.callbacks.append(meter.gc_event)  # Python's cyclic collector, wherever it strikes
    with tempfile.TemporaryDirectory(prefix="gpl-bench-") as tmp:
        if args.child == "mlflow":
            info = child_mlflow(meter, tmp)
        else:
            info = child_gpuledger(args.child, args.root, meter, tmp, args.driver_us)
    rows = meter.rows[args.warmup :]
    if profile is not None:
        stats = pstats.Stats(profile, stream=sys.stdout)
        print(
            f"\n== cProfile (thread CPU clock) of {VARIANTS[args.child]}, {len(rows)} samples after "
            f"{args.warmup} warm-up; profiler overhead included =="
        )
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(40)
        print_by_module(stats, len(rows))
    with open(args.out, "w") as fh:
        json.dump({"rows": rows, **info}, fh)


# -- the orchestrating process ----------------------------------------------------------------


def start_child(
    variant: str, root: int, args: argparse.Namespace, profile: bool = False, src: str | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """One variant's child process, started; ``finish_child`` waits for it and reads its figures."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = fh.name
    cmd = [
        sys.executable, os.path.abspath(__file__), "--child", variant, "--root", str(root), "--out", out,
        "--ticks", str(args.ticks), "--warmup", str(args.warmup),
    ] + (["--profile", variant] if profile else []) + (["--src", src] if src else []) + (
        ["--driver-us", str(args.driver_us)] if args.driver_us else [])  # fmt: skip
    return subprocess.Popen(cmd), out


def finish_child(proc: subprocess.Popen[bytes], out: str) -> dict[str, Any]:
    try:
        if proc.wait() != 0:
            raise subprocess.CalledProcessError(proc.returncode, proc.args)
        with open(out) as fh:
            return json.load(fh)
    finally:
        os.unlink(out)


def run_child(
    variant: str, root: int, args: argparse.Namespace, profile: bool = False, src: str | None = None
) -> dict[str, Any]:
    return finish_child(*start_child(variant, root, args, profile, src))


def run_round(
    order: list[str], src: dict[str, str | None], root: int, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """One round's figures, in ``order``: the variants one after the other, or with ``--together``
    all at once, each started half a tick after the one before, so that no two sample at the same
    instant while the machine's slow and fast minutes fall on all of them alike."""
    if not args.together:
        return [run_child(v.removesuffix("@base"), root, args, src=src[v]) for v in order]
    started = []
    for i, v in enumerate(order):
        if i:
            time.sleep(STAGGER_S)
        started.append(start_child(v.removesuffix("@base"), root, args, src=src[v]))
    return [finish_child(proc, out) for proc, out in started]


def summarise(rows: list[dict[str, Any]]) -> dict[str, float]:
    ms = [r["cpu_ns"] / 1e6 for r in rows]
    return {
        "n": len(ms), "median": median(ms), "p95": p95(ms), "mean": sum(ms) / len(ms),
        "proc_mean": 1e3 * sum(r["proc_s"] for r in rows) / len(rows),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=30, help="samples counted per variant per round (default 30)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the three variants, in rotated order")
    ap.add_argument("--warmup", type=int, default=5, help="samples not counted at the start of each process")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 10 samples, 1 round, 2 warm-up")
    ap.add_argument("--profile", choices=sorted(VARIANTS), help="run one variant under cProfile instead")
    ap.add_argument("--variants", default="gl-host,gl-gpu8,mlflow",
                    help="comma-separated; gl-nvml (a real GPU) is run only when named")  # fmt: skip
    ap.add_argument("--baseline", metavar="DIR", help="also run the gpuledger variants on the source tree DIR")
    ap.add_argument("--driver-us", type=float, default=0.0, metavar="US",
                    help="CPU each scripted NVML query also spends, as a real driver's does (default 0)")  # fmt: skip
    ap.add_argument("--together", action="store_true",
                    help="run each round's variants at the same time (half a tick apart), not in turn")  # fmt: skip
    ap.add_argument("--src", help=argparse.SUPPRESS)
    ap.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    ap.add_argument("--root", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if args.quick:
        args.ticks, args.rounds, args.warmup = 10, 1, 2

    variants = [v for v in args.variants.split(",") if v]
    src: dict[str, str | None] = dict.fromkeys(variants)
    if args.baseline:
        base_src = os.path.join(os.path.abspath(args.baseline), "src")
        if not os.path.isdir(os.path.join(base_src, "gpuledger")):
            raise SystemExit(f"--baseline {args.baseline}: no src/gpuledger there")
        for v in [v for v in variants if v.startswith("gl-")]:
            VARIANTS[v + "@base"] = VARIANTS[v].replace("gpuledger", "baseline", 1)
            src[v + "@base"] = base_src
            variants.insert(variants.index(v) + 1, v + "@base")
    print(f"# {machine_line()}; mlflow {version('mlflow-skinny')}\n# {source_state()}")
    if args.baseline:
        print(f"# baseline: {source_state(args.baseline)}")
    tree = start_tree()
    try:
        if args.profile:
            run_child(args.profile, tree.pid, args, profile=True)
            return
        results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        info: dict[str, dict[str, Any]] = {}
        for r in range(args.rounds):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            t0 = time.monotonic()
            for v, res in zip(order, run_round(order, src, tree.pid, args), strict=True):
                s = summarise(res["rows"])
                print(
                    f"  round {r + 1}: {VARIANTS[v]:32} mean {s['mean']:6.2f} ms/sample ({time.monotonic() - t0:.0f} s)"
                )
                results[v].append(res)
                info[v] = res
        report(results, info, args)
    finally:
        stop_tree(tree)


def ratio_interval(this: list[dict[str, Any]], base: list[dict[str, Any]], draws: int = 4000) -> tuple[float, float]:
    """95 % bootstrap interval of the ratio of mean CPU per sample, this tree / baseline.

    The machine's noise moves whole rounds (a slow neighbour, a busy minute), so the independent
    units are the rounds: pairs of rounds are drawn with replacement, each draw's ratio of means
    taken, and the 2.5th and 97.5th percentiles returned (seeded: the same input, the same answer).
    """
    totals = [
        (sum(r["cpu_ns"] for r in t["rows"]), len(t["rows"]), sum(r["cpu_ns"] for r in b["rows"]), len(b["rows"]))
        for t, b in zip(this, base, strict=True)
    ]
    rng = random.Random(0)
    ratios = []
    for _ in range(draws):
        pick = [totals[rng.randrange(len(totals))] for _ in totals]
        t_ns, t_n, b_ns, b_n = (sum(column) for column in zip(*pick, strict=True))
        ratios.append((t_ns / t_n) / (b_ns / b_n))
    ratios.sort()
    return ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]


def report(results: dict[str, list[dict[str, Any]]], info: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\nCPU per sample (ms), {args.rounds} rounds x {args.ticks} samples, {args.warmup} warm-up samples dropped")
    print(f"  {'':32} {'n':>4} {'median':>7} {'p95':>7} {'mean':>7} {'process':>8}")
    stats = {}
    for v, runs in results.items():
        s = stats[v] = summarise([row for res in runs for row in res["rows"]])
        print(
            f"  {VARIANTS[v]:32} {s['n']:4d} {s['median']:7.2f} {s['p95']:7.2f} {s['mean']:7.2f} {s['proc_mean']:8.2f}"
        )
    print("  (mean = all the thread's CPU / samples, writes included; process = whole-process CPU / samples)")
    for v in results:
        print(f"  {VARIANTS[v]}: {info[v]['settings']}; {info[v]['written']}")

    for v in (x for x in stats if x.endswith("@base")):
        this = v.removesuffix("@base")
        paired = [
            summarise(t["rows"])["mean"] / summarise(b["rows"])["mean"]
            for t, b in zip(results[this], results[v], strict=True)
        ]
        print(f"\nRatio this tree / baseline, {VARIANTS[this]} (same run; below 1: this tree uses less)")
        mean, med = stats[this]["mean"] / stats[v]["mean"], stats[this]["median"] / stats[v]["median"]
        print(
            f"  mean {mean:5.3f}   median {med:5.3f}   per round (means) {', '.join(f'{x:.2f}' for x in paired)}; "
            f"median of rounds {median(paired):.3f}"
        )
        if len(paired) >= 4:
            low, high = ratio_interval(results[this], results[v])
            verdict = "less" if high < 1 else "more" if low > 1 else "no difference shown"
            print(f"  95 % interval of the mean ratio, rounds resampled: {low:.3f} to {high:.3f} ({verdict})")

    if "mlflow" in stats:
        print("\nRatio MLflow / gpuledger (same run)")
        for v in (x for x in stats if x != "mlflow" and not x.endswith("@base")):
            paired = [
                summarise(m["rows"])["mean"] / summarise(g["rows"])["mean"]
                for m, g in zip(results["mlflow"], results[v], strict=False)
            ]
            print(
                f"  {VARIANTS[v]:32} mean {stats['mlflow']['mean'] / stats[v]['mean']:5.1f}x   "
                f"median {stats['mlflow']['median'] / stats[v]['median']:5.1f}x   "
                f"per round (means) {', '.join(f'{x:.1f}x' for x in paired)}; "
                f"min / median / max of rounds {min(paired):.1f} / {median(paired):.1f} / {max(paired):.1f}x"
            )
            own = [own_ms(g["rows"]) for g in results[v]]
            if any("scripted driver" in row["phases"] for g in results[v] for row in g["rows"]):
                # the scripted NVML answers in Python where real GPUs answer in the driver: left out
                per_round = [summarise(m["rows"])["mean"] / o for m, o in zip(results["mlflow"], own, strict=False)]
                total_own = own_ms([row for g in results[v] for row in g["rows"]])
                print(
                    f"  {OWN_LABEL:32} mean {stats['mlflow']['mean'] / total_own:5.1f}x   "
                    f"({total_own:.3f} ms per sample without the scripted driver)   "
                    f"per round {', '.join(f'{x:.1f}x' for x in per_round)}; min / median / max of rounds "
                    f"{min(per_round):.1f} / {median(per_round):.1f} / {max(per_round):.1f}x"
                )

    print("\nWhere the time goes: mean ms per sample (and per occurrence, for phases not in every sample)")
    for v, runs in results.items():
        rows = [row for res in runs for row in res["rows"]]
        print(f"  {VARIANTS[v]}")
        top = MLFLOW_PHASES if v == "mlflow" else GL_PHASES
        total = sum(r["cpu_ns"] for r in rows) / len(rows) / 1e6
        for k in top:
            print_phase(k, rows, "    ")
            for sub, parent in ({} if v == "mlflow" else GL_SUBPHASES).items():
                if parent == k:
                    print_phase(sub, rows, "      of which ")
            if k == "gpu read" and any("scripted driver" in r["phases"] for r in rows):
                own = sum(r["phases"].get(k, 0) - r["phases"].get("scripted driver", 0) for r in rows)
                print(f"      {'of which gpuledger (the rest)':30} {own / len(rows) / 1e6:7.3f}")
        rest = total - sum(sum(r["phases"].get(k, 0) for r in rows) / len(rows) / 1e6 for k in top)
        print(f"    {'other (loop, wake-up, timers)':32} {rest:7.3f}")
        for gen in range(3):  # inside the phases above: where a collection strikes, it is counted
            if any(f"gc gen {gen}" in r["phases"] for r in rows):
                print_phase(f"gc gen {gen}", rows, "    in any phase: ")


OWN_LABEL = "  without the scripted driver"


def own_ms(rows: list[dict[str, Any]]) -> float:
    """Mean CPU per sample without the scripted NVML's own answers (its "scripted driver" phase):
    what the recorder itself costs, the driver's part being real hardware's on a GPU machine. The
    timers around each query are the recorder's here, so this slightly overstates it."""
    return sum(r["cpu_ns"] - r["phases"].get("scripted driver", 0) for r in rows) / len(rows) / 1e6


def print_phase(name: str, rows: list[dict[str, Any]], indent: str) -> None:
    values = [r["phases"].get(name, 0) / 1e6 for r in rows]
    hits = sum(1 for x in values if x)
    mean = sum(values) / len(values)
    note = f"   in {hits}/{len(rows)} samples, {sum(values) / hits:.3f} each" if 0 < hits < len(rows) else ""
    print(f"{indent}{name:{36 - len(indent)}} {mean:7.3f}{note}")


if __name__ == "__main__":
    main()
