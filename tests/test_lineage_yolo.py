"""Lineage of three chained REAL trainings and the comparability of two real evaluations (issue 37).

One module-scoped fixture, real Ultralytics on the CPU, offline, on a generated dataset, each under
``gpuledger run``: v1 trains from the YAML, v2 fine-tunes v1's best.pt, v3 fine-tunes v2's best.pt
(1 epoch each), then ``yolo val`` of v2's weights at imgsz=64 under a replayed A100 trace and of v3's
weights at imgsz=96 under a replayed H100 trace. The parents are checked against sha256 computed
here with hashlib over the weights files Ultralytics wrote, not against what gpuledger recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from ci_support import need_module
from gpuledger.cli.main import cli
from gpuledger.core.model import RunRecord
from gpuledger.store import Ledger
from yolo_support import make_dataset, prepare_config_dir, yolo_env

need_module("ultralytics", "pip install -r requirements-test.txt")

pytestmark = pytest.mark.slow

SRC = str(Path(__file__).resolve().parents[1] / "src")
GPULEDGER = [sys.executable, "-m", "gpuledger"]
TIMEOUT_S = 900
COMMON = ["batch=4", "device=cpu", "plots=False", "exist_ok=True"]
TRAIN = ["imgsz=64", "workers=0", "seed=0", "epochs=1", *COMMON]


def _trace(path: Path, uuid: str, name: str) -> Path:
    header = {"format": "gpuledger-gpu-trace", "version": 1, "gpus": [{"uuid": uuid, "name": name, "profile": "ideal"}]}
    point = {"t": 0, "gpu": uuid, "util_pct": 40, "mem_used_b": 2 << 30, "power_w": 250.0}
    path.write_text(json.dumps(header) + "\n" + json.dumps(point) + "\n")
    return path


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Chain:
    root: Path
    db: str
    project: Path
    outputs: dict[str, subprocess.CompletedProcess] = field(default_factory=dict)

    def run(self, name: str) -> RunRecord:
        with Ledger(self.db) as ledger:
            for run in ledger.list_runs():
                if run.name == name:
                    return run
        raise AssertionError(f"no run {name}")

    def best(self, name: str) -> Path:
        return self.project / name / "weights" / "best.pt"


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Chain:
    root = tmp_path_factory.mktemp("lineage")
    config = prepare_config_dir(root / "config")
    data = make_dataset(root / "dataset", "detect", n_train=4, n_val=4)
    db = f"sqlite:///{root}/ledger.db"
    env = yolo_env(config)
    env.update(GPULEDGER_HOME=str(root / "home"), GPULEDGER_DB=db)
    env["PYTHONPATH"] = os.pathsep.join([SRC, *filter(None, [env.get("PYTHONPATH")])])
    env.pop("CUDA_VISIBLE_DEVICES", None)
    yolo = shutil.which("yolo") or str(Path(sys.executable).parent / "yolo")
    t = Chain(root, db, root / "runs")
    a100 = _trace(root / "a100.jsonl", "GPU-0e7a1b2c-3d4e-4f50-8a6b-7c8d9e0f1a2b", "NVIDIA A100-SXM4-80GB")
    h100 = _trace(root / "h100.jsonl", "GPU-1e7a1b2c-3d4e-4f50-8a6b-7c8d9e0f1a2b", "NVIDIA H100 80GB HBM3")

    def record(name: str, trace: Path, *cmd: str, version: str | None = None) -> None:
        labels = [] if version is None else ["--label", f"model_version={version}"]
        argv = [*GPULEDGER, "run", "--name", name, *labels, "--interval", "0.5", "--replay-gpus", str(trace), "--"]
        out = subprocess.run([*argv, *cmd], env=env, cwd=root, capture_output=True, timeout=TIMEOUT_S)
        t.outputs[name] = out
        tail = (out.stdout[-3000:] + out.stderr[-3000:]).decode(errors="replace")
        assert out.returncode == 0, f"{name}: exit {out.returncode}\n{tail}"

    project = f"project={t.project}"
    record("v1", a100, yolo, "train", "model=yolov8n.yaml", f"data={data}", project, "name=v1", *TRAIN, version="v1")
    record("v2", a100, yolo, "train", f"model={t.best('v1')}", f"data={data}", project, "name=v2", *TRAIN, version="v2")
    record("v3", a100, yolo, "train", f"model={t.best('v2')}", f"data={data}", project, "name=v3", *TRAIN, version="v3")
    val = [yolo, "val", f"data={data}", project, *COMMON]
    record("val-v2", a100, *val, f"model={t.best('v2')}", "imgsz=64", "name=val2")
    record("val-v3", h100, *val, f"model={t.best('v3')}", "imgsz=96", "name=val3")
    return t


def test_each_training_is_the_child_of_the_run_whose_best_pt_it_started_from(chain: Chain) -> None:
    v1, v2, v3 = (chain.run(n) for n in ("v1", "v2", "v3"))
    l1, l2, l3 = (r.meta["lineage"] for r in (v1, v2, v3))
    assert l1["parent_run"] is None and l1["source_weights"] is None  # trained from the YAML
    assert l1["weights_sha256"] == sha256_of(chain.best("v1"))
    assert l2["source_weights"]["sha256"] == sha256_of(chain.best("v1")) and l2["parent_run"] == v1.id
    assert l3["source_weights"]["sha256"] == sha256_of(chain.best("v2")) and l3["parent_run"] == v2.id
    assert [x["model_version"] for x in (l1, l2, l3)] == ["v1", "v2", "v3"]
    assert l1["model_line"] == l2["model_line"] == l3["model_line"] == "yolov8n"  # not "best"


def test_lineage_command_shows_the_whole_chain_from_any_of_its_ids(chain: Chain) -> None:
    runner = CliRunner()
    v1, v2, v3 = (chain.run(n) for n in ("v1", "v2", "v3"))
    for ref in ("v2", v3.id, chain.run("val-v2").id):
        out = runner.invoke(cli, ["lineage", ref, "--json", "--db", chain.db])
        assert out.exit_code == 0, out.output
        model = json.loads(out.stdout)
        assert [v["run_id"] for v in model["versions"]] == [v1.id, v2.id, v3.id]
        assert [v["model_version"] for v in model["versions"]] == ["v1", "v2", "v3"]
    by_id = {v["run_id"]: v for v in model["versions"]}
    second = by_id[v2.id]
    assert second["parent_run"] == v1.id and second["host"] == v2.host
    assert second["gpu_model"] == "NVIDIA A100-SXM4-80GB"
    assert second["gpu_hours"] > 0 and second["energy_kwh"] > 0 and second["best_map"] is not None
    assert second["dataset"]["fingerprint"] == v2.meta["dataset"]["sha256"]
    expected = (second["best_map"] - by_id[v1.id]["best_map"]) * 100
    assert second["change"]["best_map_points"] == pytest.approx(expected)
    assert [e["run_id"] for e in second["evaluations"]] == [chain.run("val-v2").id]
    assert [e["run_id"] for e in by_id[v3.id]["evaluations"]] == [chain.run("val-v3").id]
    table = runner.invoke(cli, ["lineage", "v2", "--db", chain.db])
    assert table.exit_code == 0, table.output
    assert "yolov8n" in table.stdout and "v2 *" in table.stdout and "evaluations" in table.stdout


def test_lineage_of_an_unknown_ref_is_one_error_line(chain: Chain) -> None:
    out = CliRunner().invoke(cli, ["lineage", "no-such-version", "--db", chain.db])
    assert out.exit_code == 1 and out.output.startswith("Error: ") and len(out.output.splitlines()) == 1


def test_real_evaluations_on_other_gpu_and_imgsz_are_not_comparable(chain: Chain) -> None:
    a, b = chain.run("val-v2"), chain.run("val-v3")
    out = CliRunner().invoke(cli, ["compare", a.id, b.id, "--json", "--db", chain.db])
    assert out.exit_code == 0, out.output
    verdict = json.loads(out.stdout)["comparability"][1]
    found = {d["key"]: (d["a"], d["b"]) for d in verdict["differences"]}
    assert found == {"gpu_model": ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"), "imgsz": ("64", "96")}
    assert verdict["same_data"] and not verdict["same_hardware"]
    claim = CliRunner().invoke(cli, ["compare", a.id, b.id, "--claim", "30%", "--db", chain.db])
    assert claim.exit_code == 0, claim.output
    line = claim.stdout.strip()
    assert (
        line.startswith("claimed +30 %, measured ")
        and "(not comparable: GPU model" in line
        and "imgsz 64 vs 96" in line
    )
    same = CliRunner().invoke(cli, ["compare", a.id, a.id, "--claim", "30%", "--db", chain.db])
    assert "measured +0 % (same data, same hardware)" in same.stdout
