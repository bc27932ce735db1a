"""A real recorded run that the diagnosis must catch: ``gpuledger run`` meters a Python "training"
whose data loader saturates every CPU core while the GPU (a replayed trace: one busy second in
six) waits for data. The report must say "input-pipeline bound" and render; the HTML is kept as
a test artifact."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from e2e_helpers import cli_env, py, run_cli

TRACE = Path(__file__).parent / "data" / "reports" / "starved-a100.jsonl"
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"

# The loader: one worker per core decoding "images" (burning CPU) for 40 s; the main loop only
# hands batches to the GPU.
SLOW_LOADER = """
import multiprocessing as mp, os, time
def worker(stop):
    x = 0
    while time.time() < stop:
        for i in range(20000):
            x += i * i
if __name__ == "__main__":
    stop = time.time() + 40
    procs = [mp.Process(target=worker, args=(stop,)) for _ in range(os.cpu_count() or 2)]
    for p in procs: p.start()
    for p in procs: p.join()
    print("trained 0 epochs: the GPU waited for data")
"""


@pytest.mark.slow
def test_a_real_cpu_bound_input_pipeline_is_diagnosed(tmp_path: Path) -> None:
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db")
    ran = run_cli(
        ["run", "--name", "slow loader", "--interval", "1", "--replay-gpus", str(TRACE), "--", *py(SLOW_LOADER)],
        env,
        timeout=180,
    )
    assert ran.returncode == 0, ran.stderr.decode()
    run_id = json.loads(run_cli(["runs", "--json"], env).stdout)[0]["id"]
    out = run_cli(["report", "run", run_id, "--format", "json"], env)
    assert out.returncode == 0, out.stderr.decode()
    model = json.loads(out.stdout)
    found = {f["rule"]: f for f in model["findings"]}
    assert "input_pipeline" in found, [f["title"] for f in model["findings"]]
    pipeline = found["input_pipeline"]
    assert pipeline["figures"]["gpu_busy"] < 0.3
    assert pipeline["figures"]["reason"] in ("cpu", "single_process")
    assert pipeline["evidence"], "the starved spans are the evidence"
    assert model["run"]["replayed"] is True
    ARTIFACTS.mkdir(exist_ok=True)
    html = ARTIFACTS / "real-run-report.html"
    assert run_cli(["report", "run", run_id, "-o", str(html)], env).returncode == 0
    assert html.stat().st_size > 50_000
    md = run_cli(["report", "run", run_id, "--format", "md"], env).stdout.decode()
    assert "Input-pipeline bound" in md
    assert os.path.exists(html)
