"""The comparability verdict between two evaluation runs and the one-line answer to a claim (issue 37)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.cli.main import cli
from gpuledger.reports.run import comparability as c
from report_support import write_run

FP = "a" * 64


def evaluation(**over: object) -> dict:
    base = {
        "mode": "val",
        "images": 500,
        "ms_per_image": {"preprocess": 0.5, "inference": 10.0, "postprocess": 1.0},
        "fps_inference": 100.0,
        "j_per_image": 2.5,
        "split": {"name": "val", "fingerprint": FP},
        "imgsz": 640,
        "batch": 16,
        "precision": "fp32",
        "device": "0",
        "gpu_model": "NVIDIA A100-SXM4-80GB",
        "versions": {"ultralytics": "8.4.190", "torch": "2.5.1", "cuda": "12.4"},
        "map50": 0.61,
        "map50_95": 0.452,
    }
    base.update(over)
    return base


def keys(a: dict, b: dict) -> list[str]:
    return [d.key for d in c.verdict(c.facts(a), c.facts(b)).differences]


def test_same_evaluation_is_comparable() -> None:
    v = c.verdict(c.facts(evaluation()), c.facts(evaluation()))
    assert v.comparable and v.same("data") and v.same("hardware")
    assert v.summary.startswith("comparable")


@pytest.mark.parametrize(
    ("change", "key", "shown"),
    [
        ({"imgsz": 320}, "imgsz", "imgsz 640 vs 320"),
        ({"batch": 1}, "batch", "batch 16 vs 1"),
        ({"precision": "half"}, "precision", "precision fp32 vs half"),
        (
            {"gpu_model": "NVIDIA H100 80GB HBM3"},
            "gpu_model",
            "GPU model NVIDIA A100-SXM4-80GB vs NVIDIA H100 80GB HBM3",
        ),
        ({"split": {"fingerprint": "b" * 64}}, "split", "split fingerprint aaaaaaaaaaaa vs bbbbbbbbbbbb"),
        ({"versions": {"ultralytics": "8.3.0", "torch": "2.5.1", "cuda": "12.4"}}, "ultralytics", "8.4.190 vs 8.3.0"),
        ({"versions": {"ultralytics": "8.4.190", "torch": "2.5.1", "cuda": None}}, "cuda", "12.4 vs not recorded"),
    ],
)
def test_each_difference_is_named_with_both_values(change: dict, key: str, shown: str) -> None:
    v = c.verdict(c.facts(evaluation()), c.facts(evaluation(**change)))
    assert [d.key for d in v.differences] == [key]
    assert not v.comparable and shown in v.summary
    assert v.same("data") == (key != "split") and v.same("hardware") == (key != "gpu_model")


def test_gpus_fill_what_the_evaluation_does_not_say() -> None:
    """A CPU-device evaluation has no gpu_model of its own: the run's recorded GPUs (and their power
    limit and driver) stand in."""
    a = c.facts(evaluation(gpu_model=None), [{"name": "A100", "power_limit_w": 400.0, "driver_version": "550.54"}])
    b = c.facts(evaluation(gpu_model=None), [{"name": "A100", "power_limit_w": 300.0, "driver_version": "550.54"}])
    v = c.verdict(a, b)
    assert [d.text for d in v.differences] == ["GPU power limit 400 W vs 300 W"]


def test_not_recorded_on_both_sides_is_no_difference() -> None:
    assert keys(evaluation(batch=None), evaluation(batch=None)) == []
    assert keys(evaluation(batch=None), evaluation()) == ["batch"]


settings = st.fixed_dictionaries(
    {
        "imgsz": st.sampled_from([320, 640, None]),
        "batch": st.sampled_from([1, 16, None]),
        "precision": st.sampled_from(["fp32", "half", "int8", None]),
        "gpu_model": st.sampled_from(["A100", "H100", None]),
        "device": st.sampled_from(["0", "cpu", None]),
        "split": st.sampled_from([{"fingerprint": FP}, {"fingerprint": "b" * 64}, None]),
        "versions": st.sampled_from([{"torch": "2.5.1"}, {"torch": "2.4.0", "cuda": "12.1"}, {}]),
    }
)


@given(settings, settings)
def test_verdict_is_symmetric_and_names_exactly_the_differing_conditions(a: dict, b: dict) -> None:
    fa, fb = c.facts(evaluation(**a)), c.facts(evaluation(**b))
    ab, ba = c.verdict(fa, fb), c.verdict(fb, fa)
    assert [d.key for d in ab.differences] == [d.key for d in ba.differences]
    assert [(d.a, d.b) for d in ab.differences] == [(d.b, d.a) for d in ba.differences]
    # a differing value, or a split fingerprint neither side recorded ("the same test set" unproven)
    unproven = {"split"} if fa["split"] is None and fb["split"] is None else set()
    assert {d.key for d in ab.differences} == {k for k in fa if fa[k] != fb[k]} | unproven
    assert ab.comparable == (fa == fb and not unproven)
    assert c.verdict(fa, fa).comparable == (fa["split"] is not None)


def test_two_runs_without_a_split_fingerprint_are_not_said_to_have_seen_the_same_data() -> None:
    # a discovered evaluation, or one whose fingerprint failed: nothing shows the images were the same
    a, b = c.facts(evaluation(split=None)), c.facts(evaluation(split=None))
    v = c.verdict(a, b)
    assert not v.comparable and not v.same("data")
    assert "split fingerprint not recorded vs not recorded" in v.summary


@given(st.floats(-99, 1000, allow_nan=False), st.floats(0.1, 1000), st.floats(0.1, 1000))
def test_claim_measures_the_inference_fps_change(claimed: float, ms_a: float, ms_b: float) -> None:
    a = evaluation(fps_inference=None, ms_per_image={"inference": ms_a})
    b = evaluation(fps_inference=None, ms_per_image={"inference": ms_b})
    line = c.claim_line(claimed, a, b, c.verdict(c.facts(a), c.facts(b)))
    measured = line.split("measured ")[1].split(" %")[0].replace(c.MINUS, "-")
    assert float(measured) == pytest.approx((ms_a / ms_b - 1) * 100, abs=0.5)
    assert "(same data, same hardware)" in line


def test_the_dispute_in_one_line() -> None:
    a = evaluation(fps_inference=100.0, map50_95=0.452)
    b = evaluation(fps_inference=112.0, map50_95=0.448)
    v = c.verdict(c.facts(a), c.facts(b))
    assert c.claim_line(30, a, b, v) == "claimed +30 %, measured +12 % (same data, same hardware), mAP −0.4 points"
    b_other = evaluation(fps_inference=112.0, map50_95=0.448, imgsz=320)
    line = c.claim_line(30, a, b_other, c.verdict(c.facts(a), c.facts(b_other)))
    assert line == "claimed +30 %, measured +12 % (not comparable: imgsz 640 vs 320), mAP −0.4 points"


@pytest.mark.parametrize("text", ["30%", "+30 %", "30", "30.5%", "-5%", "−5 %"])
def test_claims_parse(text: str) -> None:
    assert c.parse_claim(text) in (30.0, 30.5, -5.0)


@pytest.mark.parametrize("text", ["", "thirty", "30%%", "=30%", "1e3%"])
def test_bad_claims_are_refused(text: str) -> None:
    with pytest.raises(c.ClaimError):
        c.parse_claim(text)


A = "0190c0c0-0000-7000-8000-0000000000e1"
B = "0190c0c0-0000-7000-8000-0000000000e2"
TRAIN = "0190c0c0-0000-7000-8000-0000000000e3"


@pytest.fixture
def db(tmp_path: Path) -> str:
    from gpuledger.store import Ledger

    url = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger(url) as ledger:
        for rid, ev in (
            (A, evaluation(fps_inference=100.0)),
            (B, evaluation(fps_inference=112.0, map50_95=0.448, precision="half")),
        ):
            write_run(
                ledger, rid, n=20, status="succeeded", name=rid[-2:], meta={"kind": "evaluation", "evaluation": ev}
            )
        write_run(ledger, TRAIN, n=20, status="succeeded", name="train")
    return url


def test_compare_cli_claim_line_and_marked_percentages(db: str) -> None:
    runner = CliRunner()
    out = runner.invoke(cli, ["compare", A, B, "--claim", "30%", "--db", db])
    assert out.exit_code == 0, out.output
    assert out.stdout == "claimed +30 %, measured +12 % (not comparable: precision fp32 vs half), mAP −0.4 points\n"
    model = json.loads(runner.invoke(cli, ["compare", A, B, "--json", "--db", db]).stdout)
    rows = {r["key"]: r for r in model["rows"]}
    fps = rows["fps_inference"]["cells"][1]
    assert fps["diff"] == "+12.0% not comparable" and fps["verdict"] == "not-comparable"
    assert [d["key"] for d in model["comparability"][1]["differences"]] == ["precision"]
    html = runner.invoke(cli, ["compare", A, B, "--format", "html", "-o", "-", "--db", db]).stdout
    assert "not comparable" in html and "precision: fp32 vs half" in html
    table = runner.invoke(cli, ["compare", A, B, "--db", db]).stdout
    assert "inference ms / image" in table and "not comparable: precision fp32 vs half" in table


def test_compare_cli_claim_refusals(db: str) -> None:
    runner = CliRunner()
    bad = runner.invoke(cli, ["compare", A, B, "--claim", "lots", "--db", db])
    assert bad.exit_code == 2 and "is not a percentage" in bad.output
    training = runner.invoke(cli, ["compare", A, TRAIN, "--claim", "30%", "--db", db])
    assert training.exit_code == 1 and "Error: --claim needs two evaluation runs" in training.output
    three = runner.invoke(cli, ["compare", A, B, TRAIN, "--claim", "30%", "--db", db])
    assert three.exit_code == 2 and "exactly two runs" in three.output
