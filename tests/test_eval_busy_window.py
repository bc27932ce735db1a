"""The busy share of an evaluation window under ``gpuledger run`` (issue 37).

A real ``gpuledger run --interval 0.5 --replay-gpus`` of a Python script that sends what an
evaluation sends (a ``phase`` "evaluation", the span, a ``phase`` "after evaluation", the
metadata with the window), on a replayed GPU at a constant 40 % utilisation and 250 W. The
expected figures come from the trace, not from gpuledger: 40 % busy, 250 W × the window.

A window shorter than one second (a ``yolo val`` of a few images lasts tens of milliseconds:
less than the utilisation sample period) used to read any share from 0 % to 100 % depending on
where the samples fell; it now reads None (not measured), while its energy is still measured.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuledger.core.metering.busy import unmeasured_seconds
from gpuledger.core.model import RunRecord
from gpuledger.store import Ledger

SRC = str(Path(__file__).resolve().parents[1] / "src")
UTIL = 0.40
POWER_W = 250.0
UUID = "GPU-0e7a1b2c-3d4e-4f50-8a6b-7c8d9e0f1a2b"
# The most busy time lands on the wrong side of one window edge: the samples read at a cut cover
# up to the newest one, at most one sample period (1/6 s on this profile) before it, plus slack
# for a loaded machine. Busy time at the two edges shifts the same way, so once per window.
LAG_S = 0.3

EVALUATE = """
    import sys, time
    from gpuledger.recorder.control import ControlClient

    client = ControlClient.from_env()
    before, span, after = (float(x) for x in sys.argv[1:4])
    time.sleep(before)  # the model's loading: outside the window
    t0 = time.time()
    client.send("phase", name="evaluation")
    time.sleep(span)  # the evaluation: the GPU works at the trace's 40 %
    t1 = time.time()
    client.send("phase", name="after evaluation")
    client.send("metadata", meta={"evaluation": {"mode": "val", "images": 8, "window": [t0, t1]}})
    time.sleep(after)
"""


def _trace(path: Path) -> Path:
    header = {"format": "gpuledger-gpu-trace", "version": 1,
              "gpus": [{"uuid": UUID, "name": "NVIDIA A100-SXM4-80GB", "profile": "ideal"}]}  # fmt: skip
    point = {"t": 0, "gpu": UUID, "util_pct": UTIL * 100, "mem_used_b": 2 << 30, "power_w": POWER_W}
    path.write_text(json.dumps(header) + "\n" + json.dumps(point) + "\n")
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, RunRecord]]:
    root = tmp_path_factory.mktemp("busy-window")
    db = f"sqlite:///{root}/ledger.db"
    env = {**os.environ, "GPULEDGER_HOME": str(root / "home"), "GPULEDGER_DB": db, "GPULEDGER_AUTOLOAD": "0"}
    env["PYTHONPATH"] = os.pathsep.join([SRC, *filter(None, [env.get("PYTHONPATH")])])
    env.pop("CUDA_VISIBLE_DEVICES", None)
    trace = _trace(root / "trace.jsonl")
    script = root / "evaluate.py"
    script.write_text(textwrap.dedent(EVALUATE))
    # Spans that are no multiple of the 1/6 s sample period: the two edges fall at different
    # places between samples, so edge errors do not cancel by luck.
    spans = {"short": "0.05", "one-second": "1.3", "longer": "2.3"}
    for name, span in spans.items():
        argv = [sys.executable, "-m", "gpuledger", "run", "--name", name, "--interval", "0.5",
                "--replay-gpus", str(trace), "--", sys.executable, str(script), "1.1", span, "0.3"]  # fmt: skip
        out = subprocess.run(argv, env=env, cwd=root, capture_output=True, timeout=300)
        assert out.returncode == 0, out.stderr.decode(errors="replace")[-3000:]
    with Ledger(db) as ledger:
        found = {r.name: r for r in ledger.list_runs()}
    return db, found


def _window(run: RunRecord) -> tuple[float, float]:
    t0, t1 = run.meta["evaluation"]["window"]
    return float(t0), float(t1)


@pytest.mark.parametrize("name", ["one-second", "longer"])
def test_a_window_of_a_second_or_more_reads_the_traces_utilisation(runs, name: str) -> None:
    ev = runs[1][name].meta["evaluation"]
    t0, t1 = _window(runs[1][name])
    assert t1 - t0 >= 1.0
    assert math.isclose(ev["energy_j"], POWER_W * (t1 - t0), rel_tol=0.01)
    assert ev["busy_share"] is not None
    assert math.isclose(ev["busy_share"], UTIL, abs_tol=UTIL * LAG_S / (t1 - t0)), ev["busy_share"]


def test_a_window_shorter_than_a_sample_period_has_no_busy_share_but_its_energy(runs) -> None:
    run = runs[1]["short"]
    ev = run.meta["evaluation"]
    t0, t1 = _window(run)
    assert t1 - t0 < 1.0
    assert ev["busy_share"] is None  # not measured: never a share of where the samples fell
    # Its energy is there, to within some milliseconds at its edges: on this machine the ~55 ms
    # window read 1-7 ms of power short in every run from one afternoon on (the session's starting
    # commit too; the cause not found: the counter read's delay after each cut is the suspect).
    # The 1.3 s and 2.3 s windows above are held to 1 %.
    edge_s = 0.02
    assert math.isclose(ev["energy_j"], POWER_W * (t1 - t0), abs_tol=POWER_W * edge_s)
    assert math.isclose(ev["power_mean_w"], POWER_W, abs_tol=POWER_W * edge_s / (t1 - t0))


@pytest.mark.parametrize("name", ["short", "one-second", "longer"])
def test_the_window_intervals_classify_every_second_of_the_window(runs, name: str) -> None:
    """Sampled (busy / 40 %) + idle + unmeasured of the intervals in the window, each counted in
    the share of it the window holds, is the window: within one sample period's lag."""
    db, found = runs
    run = found[name]
    t0, t1 = _window(run)
    with Ledger(db) as ledger:
        intervals = ledger.gpu_intervals(run.id)
    classified = covered = 0.0
    for iv in intervals:
        overlap = min(iv.t1, t1) - max(iv.t0, t0)
        if overlap <= 0:
            continue
        share = overlap / (iv.t1 - iv.t0)
        assert iv.busy_s is not None and iv.util_idle_s is not None
        # unknown time the instant reading measured is in busy_s, at the trace's 40 %
        classified += share * (iv.busy_s / UTIL + iv.util_idle_s + unmeasured_seconds(iv))
        covered += overlap
    assert math.isclose(covered, t1 - t0, rel_tol=1e-6)  # the intervals tile the window
    assert abs(classified - (t1 - t0)) <= LAG_S, (classified, t1 - t0)
