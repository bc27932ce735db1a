"""Where `gpuledger run -q -- python -c pass` spends its own CPU, phase by phase (issue 34).

    python benchmarks/wrapper_phases.py [--runs 5] [--tree DIR]

Runs the recorder process with `time.process_time()` stamps taken as it passes each phase (the
CLI's modules, the recorder's, the wrapper's, building the redaction rules, opening the collectors,
the launch, the run record, the wait, the end of the run) and prints the cumulative CPU at each
stamp for the run with the least CPU in all (the least disturbed by other load), and every run's
total. Only the recorder process is counted, not the relay, git or the command. The stamps wrap
functions of recorder/wrap.py and Session.finish from outside: nothing in gpuledger is changed.
--tree DIR: the source tree to measure (its src/), default the installed gpuledger.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import machine_line

CHILD = r"""
import atexit, os, sys, time
T0 = time.process_time()
me, marks = os.getpid(), []
def mark(name):
    marks.append((name, time.process_time() - T0))
def report():
    if os.getpid() == me:
        mark("exit")
        sys.stderr.write("PHASES " + " ".join(f"{n}={t:.4f}" for n, t in marks) + "\n")
atexit.register(report)
sys.argv = ["gpuledger", *sys.argv[1:]]
import gpuledger.cli.main as cli
mark("cli")
import gpuledger.cli.run_cmd
mark("recorder_modules")
import gpuledger.recorder.wrap as wrap
mark("wrapper_modules")
from gpuledger.core.redaction.redact import Redactor
Redactor.default()
mark("redaction_rules")
def stamped(name):
    real = getattr(wrap, name)
    def call(*a, **k):
        out = real(*a, **k)
        mark(name.strip("_"))
        return out
    setattr(wrap, name, call)
for name in ("_open_edge", "launch", "_start_session", "_reap_until"):
    stamped(name)
import gpuledger.recorder.session as session
finish = session.Session.finish
def finished(self, *a, **k):
    out = finish(self, *a, **k)
    mark("finish")
    return out
session.Session.finish = finished
cli.main()
"""


def one_run(env: dict[str, str]) -> list[tuple[str, float]]:
    argv = [sys.executable, "-c", CHILD, "run", "-q", "--", sys.executable, "-c", "pass"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    line = next((x for x in proc.stderr.splitlines() if x.startswith("PHASES ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"the instrumented run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return [(name, float(t)) for name, t in (item.split("=") for item in line.split()[1:])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tree", metavar="DIR", help="measure the source tree DIR (its src/)")
    args = ap.parse_args()
    print(f"# {machine_line()}")
    with tempfile.TemporaryDirectory(prefix="gpl-phases-") as tmp:
        env = {**os.environ, "GPULEDGER_HOME": tmp}
        env.pop("GPULEDGER_DB", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # from bytecode, as an installed gpuledger runs
        if args.tree:
            env["PYTHONPATH"] = os.path.join(os.path.abspath(args.tree), "src")
        one_run(env)  # creates the ledger (SQLAlchemy), writes the bytecode
        runs = [one_run(env) for _ in range(args.runs)]
    print("recorder process CPU at the end of each run: " + ", ".join(f"{r[-1][1]:.3f}" for r in runs) + " s")
    best = min(runs, key=lambda r: r[-1][1])
    print("the run with the least CPU, cumulative CPU at each stamp (and the phase's own):")
    last = 0.0
    for name, t in best:
        print(f"  {name:18} {t:.3f} s  (+{t - last:.3f})")
        last = t
    print(f"# load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
