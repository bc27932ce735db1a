"""Wall-time overhead of `gpuledger run` on a CPU-bound command: paired runs, bare vs wrapped (issue 2).

    python benchmarks/wrapper_overhead.py [--seconds 25] [--pairs 6] [--interval SECONDS] [--quick]
    python benchmarks/wrapper_overhead.py --fixed ROUNDS [--with-db] [--baseline DIR] [--tree DIR]

--fixed ROUNDS measures only gpuledger's fixed cost per run: `python -c pass` bare and under
`gpuledger run -q -- python -c pass`, in turn (the order swapped every round), wall time and CPU
(user + system of the whole process tree, wait4), and the split before / after the command as
below; it prints min / median / max of the per-round differences. The wrapped form records into
the default ledger (GPULEDGER_HOME in a temp dir), or with --with-db into `--db sqlite:///...`,
which `gpuledger run` opens before it starts the command (the team-ledger check). --baseline DIR
adds a third form, `python -m gpuledger run ...` from the source tree DIR (e.g. a `git worktree`
of an older commit), in the same rotation, and prints this tree's CPU cost over the baseline's;
--tree DIR wraps with `python -m gpuledger` from DIR instead of the installed gpuledger (a clean
worktree of a commit, when the shared working tree holds others' unfinished edits). Both trees are
byte-compiled first and the runs get no PYTHONDONTWRITEBYTECODE: an installed gpuledger runs
from bytecode, and recompiling every module on every run is no cost of gpuledger's.

The command is a pure-Python loop doing a fixed amount of work (calibrated once to take about
--seconds bare). Runs alternate bare/wrapped, swapping the order every pair (B W, W B, ...), and
the overhead is taken pair by pair, (wrapped - bare) / bare, so drift on a shared machine cancels;
the median over pairs is the figure. Wrapped = `gpuledger run -q --db sqlite:///<tmp>/ledger.db
-- CMD` at the default interval (5 s) unless --interval, with the installed console script of this
interpreter. Both forms get the same environment (GPULEDGER_HOME in a temp dir) and discard output.

The command stamps its own start and end (time.time() into a file), so each wall time splits into
  before: from our Popen to the command's first line (interpreter start; for gpuledger also its
          own start-up, which runs before it launches CMD),
  cmd:    the command's own run (where the recorder's sampling can slow it down),
  after:  from the command's last line until the wrapper has exited (gpuledger: final flush,
          run summary, log archiving).
Also measured, not paired: gpuledger's own steady-state CPU, the CPU time of every thread of
gpuledger and its relay while it meters `sleep` (from /proc/<pid>/task/*/schedstat, in ns,
between 5 s after the start and 2 s before the end), which does not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import subprocess
import sys
import tempfile
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import gpuledger_executable, machine_line, median, source_state, version

LOOP = (
    "import sys, time\n"
    "stamp = open(sys.argv[2], 'w') if len(sys.argv) > 2 else None\n"
    "stamp and stamp.write(repr(time.time()) + '\\n')\n"
    "x = 0\n"
    "for i in range(int(sys.argv[1])):\n"
    "    x += i * i % 7\n"
    "stamp and stamp.write(repr(time.time()) + '\\n')\n"
)


def run(argv: list[str], env: dict[str, str], stamp: str | None = None) -> dict[str, float]:
    """Wall seconds, child CPU seconds (wait4: includes what it reaped), and the before/cmd/after split."""
    if stamp and os.path.exists(stamp):
        os.unlink(stamp)
    t0 = time.time()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)  # fmt: skip
    _, status, ru = os.wait4(proc.pid, 0)
    t1 = time.time()
    code = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if code != 0 or err.strip():
        print(f"  ! {' '.join(argv[:4])} ... exited {code}: {err.strip()[:500]}", file=sys.stderr)
    out = {"wall": t1 - t0, "cpu": ru.ru_utime + ru.ru_stime}
    if stamp:
        with open(stamp) as fh:
            a, b = (float(x) for x in fh.read().split())
        out.update(before=a - t0, cmd=b - a, after=t1 - b)
    return out


STAMP = "import sys, time; open(sys.argv[1], 'w').write(repr(time.time()) + ' ' + repr(time.time()))"


def fixed_cost(
    gl: list[str],
    rounds: int,
    env: dict[str, str],
    stamp: str,
    baseline: str | None = None,
    tree: str | None = None,
) -> None:
    """`python -c pass`-sized command bare and wrapped (and wrapped by a baseline tree), in turn,
    the order rotated every round: the differences to bare, per round. ``tree``: wrap with
    `python -m gpuledger` from that source tree (a clean checkout) instead of the installed one."""
    bare = [sys.executable, "-c", STAMP, stamp]
    forms: dict[str, tuple[list[str], dict[str, str]]] = {"bare": (bare, env), "wrapped": ([*gl, "--", *bare], env)}
    if tree:
        tree_env = {**env, "PYTHONPATH": os.path.join(os.path.abspath(tree), "src")}
        forms["wrapped"] = ([sys.executable, "-m", "gpuledger", *gl[1:], "--", *bare], tree_env)
    if baseline:  # the same options, `python -m gpuledger` from the baseline's src/
        home = os.path.join(env["GPULEDGER_HOME"], "baseline")  # a ledger of its own: schema versions differ
        base_env = {**env, "PYTHONPATH": os.path.join(os.path.abspath(baseline), "src"), "GPULEDGER_HOME": home}
        forms["baseline"] = ([sys.executable, "-m", "gpuledger", *gl[1:], "--", *bare], base_env)
    for argv, form_env in forms.values():
        run(argv, form_env, stamp)  # create the ledger; warm the page cache
    names = list(forms)
    diffs: dict[str, dict[str, list[float]]] = {n: {k: [] for k in ("wall", "cpu", "before", "after")} for n in names}
    for i in range(rounds):
        order = names[i % len(names) :] + names[: i % len(names)]
        got = {name: run(*forms[name], stamp) for name in order}
        for name in names[1:]:
            for key in diffs[name]:
                diffs[name][key].append(got[name][key] - got["bare"][key])
        print(f"  round {i + 1:2} ({' '.join(order)}): " + "; ".join(
            f"{n} wall {got[n]['wall']:.3f} CPU {got[n]['cpu']:.3f} before/after {got[n]['before']:.3f}/"
            f"{got[n]['after']:.3f} s" for n in names), flush=True)  # fmt: skip
    print(f"\nfixed cost of `{' '.join(gl[1:])} -- python -c ...` over bare python, {rounds} rounds in turn "
          "(min / median / max of the per-round differences):")  # fmt: skip
    for name in names[1:]:
        print(f"  {name}{' (' + baseline + ')' if name == 'baseline' else ''}")
        for key, what in (("wall", "wall"), ("cpu", "CPU (user+sys, tree)"), ("before", "before CMD starts"),
                          ("after", "after CMD ends")):  # fmt: skip
            xs = diffs[name][key]
            print(f"    {what:22} {min(xs):+.3f} / {median(xs):+.3f} / {max(xs):+.3f} s")
    if baseline:
        ratios = [w / b for w, b in zip(diffs["wrapped"]["cpu"], diffs["baseline"]["cpu"], strict=True)]
        print(f"  CPU cost this tree / baseline, per round: min / median / max {min(ratios):.2f} / "
              f"{median(ratios):.2f} / {max(ratios):.2f}")  # fmt: skip
    print(f"# load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def package_dir() -> str:
    spec = importlib.util.find_spec("gpuledger")
    assert spec is not None and spec.submodule_search_locations, "gpuledger is not importable here"
    return next(iter(spec.submodule_search_locations))


def compile_trees(dirs: list[str]) -> None:
    """Byte-compile the source trees the runs import (what pip install does for a wheel)."""
    for folder in dirs:
        subprocess.run([sys.executable, "-m", "compileall", "-q", folder], check=True, stdout=subprocess.DEVNULL)
    print(f"# bytecode compiled for {', '.join(dirs)}; the runs' environment has no PYTHONDONTWRITEBYTECODE")


def calibrate(seconds: float, env: dict[str, str]) -> int:
    """Loop iterations that take about ``seconds`` in a fresh interpreter."""
    n = 5_000_000
    walls = [run([sys.executable, "-c", LOOP, str(n)], env)["wall"] for _ in range(2)]
    return max(1, int(n * seconds / min(walls)))


def paired(bare: list[str], wrapped: list[str], pairs: int, env: dict[str, str], stamp: str) -> dict[str, list]:
    out: dict[str, list] = {"bare": [], "wrapped": [], "overhead": []}
    for i in range(pairs):
        order = ("bare", "wrapped") if i % 2 == 0 else ("wrapped", "bare")
        got = {kind: run(bare if kind == "bare" else wrapped, env, stamp) for kind in order}
        out["bare"].append(got["bare"])
        out["wrapped"].append(got["wrapped"])
        out["overhead"].append((got["wrapped"]["wall"] - got["bare"]["wall"]) / got["bare"]["wall"])
        b, w = got["bare"], got["wrapped"]
        print(
            f"  pair {i + 1} ({order[0][0].upper()}{order[1][0].upper()}): bare {b['wall']:.3f} s, "
            f"wrapped {w['wall']:.3f} s, {100 * out['overhead'][-1]:+.2f} %   "
            f"[before/cmd/after: bare {b['before']:.3f}/{b['cmd']:.3f}/{b['after']:.3f}, "
            f"wrapped {w['before']:.3f}/{w['cmd']:.3f}/{w['after']:.3f}]",
            flush=True,
        )
    return out


def tree_cpu_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` and its descendants, from schedstat (ns)."""
    total = 0
    try:
        pids = [pid] + [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return 0
    for p in pids:
        for path in glob.glob(f"/proc/{p}/task/*/schedstat"):
            try:
                with open(path) as fh:
                    total += int(fh.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total


def steady_cpu(gl: list[str], seconds: float, env: dict[str, str]) -> tuple[float, float]:
    """gpuledger's own CPU (ms per second) while it meters an idle command, and the span measured."""
    seconds = max(seconds, 10.0)
    proc = subprocess.Popen([*gl, "--", "sleep", str(seconds)], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(5.0)
    c0, t0 = tree_cpu_ns(proc.pid), time.monotonic()
    time.sleep(seconds - 7.0)
    c1, t1 = tree_cpu_ns(proc.pid), time.monotonic()
    proc.wait()
    return (c1 - c0) / 1e6 / (t1 - t0), t1 - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=25.0, help="bare run time of the command (default 25)")
    ap.add_argument("--pairs", type=int, default=6, help="bare/wrapped pairs (default 6)")
    ap.add_argument("--interval", type=float, default=None, help="pass --interval to gpuledger (default: its own)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 5 s, 2 pairs")
    ap.add_argument("--fixed", type=int, metavar="ROUNDS", help="only the fixed cost per run (python -c pass), ROUNDS")
    ap.add_argument("--baseline", metavar="DIR", help="--fixed: also wrap with the source tree DIR (its src/)")
    ap.add_argument(
        "--tree", metavar="DIR", help="--fixed: wrap with the source tree DIR (its src/), not the installed gpuledger"
    )
    ap.add_argument(
        "--with-db", action="store_true", help="--fixed: record with --db sqlite:///... (default ledger else)"
    )
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.pairs = 5.0, 2

    exe = gpuledger_executable()
    print(f"# {machine_line()}; gpuledger {version('gpuledger')} ({exe})\n# {source_state()}")
    with tempfile.TemporaryDirectory(prefix="gpl-wrap-") as tmp:
        env = {**os.environ, "GPULEDGER_HOME": tmp}
        env.pop("GPULEDGER_DB", None)
        # As an installed gpuledger runs: from compiled bytecode. With PYTHONDONTWRITEBYTECODE set
        # (as in some dev shells), every run of a source tree would compile ~80 modules again.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        trees = [os.path.join(t, "src") for t in (args.tree, args.baseline) if t]
        compile_trees([package_dir(), *trees])
        gl = [exe, "run", "-q", "--db", f"sqlite:///{tmp}/ledger.db"]
        if args.fixed:
            gl = gl if args.with_db else [exe, "run", "-q"]
            fixed_cost(gl, args.fixed, env, os.path.join(tmp, "stamp"), args.baseline, args.tree)
            return
        if args.interval is not None:
            gl += ["--interval", str(args.interval)]
        n = calibrate(args.seconds, env)
        stamp = os.path.join(tmp, "stamp")
        cmd = [sys.executable, "-c", LOOP, str(n), stamp]
        interval = f"--interval {args.interval:g} " if args.interval else ""
        print(f"command: python -c <loop of {n:,} iterations>; wrapped: gpuledger run -q --db sqlite:///... "
              f"{interval}-- command")  # fmt: skip
        run([*gl, "--", sys.executable, "-c", "pass"], env)  # create the ledger; warm the page cache
        res = paired(cmd, [*gl, "--", *cmd], args.pairs, env, stamp)
        own_ms, span = steady_cpu(gl, args.seconds, env)

    def med(kind: str, key: str) -> float:
        return median([r[key] for r in res[kind]])

    def med_diff(key: str) -> float:
        return median([w[key] - b[key] for w, b in zip(res["wrapped"], res["bare"], strict=True)])

    b, w, over = med("bare", "wall"), med("wrapped", "wall"), median(res["overhead"])
    print(f"\nCPU-bound loop, {args.pairs} pairs; medians (of each column, and of the pairwise differences)")
    print(f"  wall: bare {b:.3f} s, wrapped {w:.3f} s; overhead {100 * over:+.2f} % "
          f"(pairs: {', '.join(f'{100 * x:+.2f}' for x in res['overhead'])}; "
          f"spread {100 * (max(res['overhead']) - min(res['overhead'])):.1f} points)")  # fmt: skip
    for key, what in (("before", "start-up before CMD runs"), ("cmd", "CMD's own run"), ("after", "after CMD ends")):
        print(f"  {what:26} bare {med('bare', key):7.3f} s  wrapped {med('wrapped', key):7.3f} s  "
              f"difference {med_diff(key):+.3f} s")  # fmt: skip
    fixed = med_diff("before") + med_diff("after")
    print(f"  fixed part (before + after): {fixed:+.3f} s = {100 * fixed / b:.2f} % of {b:.1f} s")
    print(f"  gpuledger's own steady CPU metering `sleep` (all its threads and its relay, {span:.0f} s): "
          f"{own_ms:.2f} ms per second = {own_ms / 10:.3f} % of one core")  # fmt: skip
    print(f"# load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
