"""The anomaly rule "inference slower than the previous version on the same data and hardware"
(core/diagnosis/inference_rules.py), alone and through `gpuledger lineage` (issue 37)."""

from __future__ import annotations

import json
import time

from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.cli.main import cli
from gpuledger.core.diagnosis.inference_rules import MIN_SLOWDOWN_PCT, inference_slower
from gpuledger.core.model import RunRecord
from gpuledger.store import Ledger
from test_lineage_store import IDS, METAS, STARTS, W1, W2


def ev(run_id: str, ms: float, gpu: str = "A100") -> dict:
    return {"run_id": run_id, "inference_ms": ms, "gpu": gpu}


def same_gpu(a: dict, b: dict) -> bool:
    return a["gpu"] == b["gpu"]


@given(st.floats(0.1, 100), st.floats(0.1, 100), st.booleans())
def test_flags_only_a_comparable_slowdown_above_the_threshold(ms: float, prev_ms: float, same: bool) -> None:
    found = inference_slower(
        "v2", "v1", [ev("e2", ms, "A100")], [ev("e1", prev_ms, "A100" if same else "H100")], same_gpu
    )
    slower = (ms / prev_ms - 1) * 100 > MIN_SLOWDOWN_PCT
    assert (found is not None) == (same and slower)
    if found is not None:
        assert found.previous_evaluation == "e1" and found.slowdown_pct > MIN_SLOWDOWN_PCT


def test_the_worst_comparable_pair_is_named() -> None:
    found = inference_slower(
        "v2", "v1", [ev("a", 12.0), ev("b", 20.0, "H100")], [ev("p", 10.0), ev("q", 5.0, "H100")], same_gpu
    )
    assert found is not None and (found.evaluation, found.previous_evaluation) == ("b", "q")
    assert "on the same data and hardware: 20 ms/image vs 5 (+300 %)" in found.message


def _evaluation(sha: str, ms: float, imgsz: int) -> dict:
    return {
        "kind": "evaluation",
        "evaluation": {
            "mode": "val", "weights": {"path": "/w/best.pt", "sha256": sha}, "imgsz": imgsz, "batch": 16,
            "precision": "fp32", "device": "0", "gpu_model": "NVIDIA A100-SXM4-80GB",
            "split": {"fingerprint": "f" * 64}, "ms_per_image": {"inference": ms},
        },
    }  # fmt: skip


def _lineage(tmp_path, v2_imgsz: int) -> dict:  # type: ignore[no-untyped-def]
    db = f"sqlite:///{tmp_path}/l{v2_imgsz}.db"
    with Ledger(db) as led:
        for name in ("v1", "v2"):
            led.create_run(RunRecord(IDS[name], ["yolo"], "u", "h", "/", STARTS[name], meta=METAS[name]))
        t = time.time() - 3600
        e1 = "0190c0c0-0000-7000-8000-0000000002e1"
        e2 = "0190c0c0-0000-7000-8000-0000000002e2"
        led.create_run(RunRecord(e1, ["yolo", "val"], "u", "h", "/", t, meta=_evaluation(W1, 10.0, 640)))
        led.create_run(RunRecord(e2, ["yolo", "val"], "u", "h", "/", t + 60, meta=_evaluation(W2, 13.0, v2_imgsz)))
    out = CliRunner().invoke(cli, ["lineage", "v2", "--json", "--db", db])
    assert out.exit_code == 0, out.output
    text = CliRunner().invoke(cli, ["lineage", "v2", "--db", db]).stdout
    return {"model": json.loads(out.stdout), "text": text}


def test_lineage_flags_a_slower_version_on_the_same_data_and_hardware(tmp_path) -> None:  # type: ignore[no-untyped-def]
    got = _lineage(tmp_path, 640)
    v1, v2 = got["model"]["versions"]
    assert v1["findings"] == []
    assert [f["rule"] for f in v2["findings"]] == ["inference_slower"]
    assert v2["findings"][0]["slowdown_pct"] == 30.0
    assert "v2: inference slower than the previous version on the same data and hardware" in got["text"]


def test_lineage_does_not_set_other_settings_against_each_other(tmp_path) -> None:  # type: ignore[no-untyped-def]
    got = _lineage(tmp_path, 320)  # v2 evaluated at another imgsz: not comparable, no finding
    assert [v["findings"] for v in got["model"]["versions"]] == [[], []]
    assert "inference slower" not in got["text"]
