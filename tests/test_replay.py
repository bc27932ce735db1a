"""Replay mode: traces drive the real NvmlCollector through the scripted NVML."""

from __future__ import annotations

import io
import json

import pytest

from gpuledger.collect.fake_nvml import FakeGpu, FakeNvml, TracePoint
from gpuledger.collect.gpus import open_gpu_collector
from gpuledger.collect.nvml import NvmlCollector
from gpuledger.collect.replay import TraceError, load_trace, open_replay, packaged_traces, record_trace
from gpuledger.core.model import ENERGY_COUNTER, UTIL_SAMPLES

EXAMPLE = "a100x2-example"
T0 = 1_750_000_000.0


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def read_for(col, clock: Clock, seconds: float, pids=frozenset({4000})):
    ticks, events = [], []
    for _ in range(int(seconds) + 1):
        r = col.read(set(pids), clock.t)
        ticks += r.ticks
        events += r.events
        clock.t += 1.0
    return ticks, events


def busy_truth(points: list[TracePoint], a: float, b: float) -> float:
    total = 0.0
    for i, p in enumerate(points):
        end = points[i + 1].t if i + 1 < len(points) else float("inf")
        lo, hi = max(a, p.t), min(b, end)
        if hi > lo:
            total += p.util_pct / 100 * (hi - lo)
    return total


def test_packaged_example_trace() -> None:
    assert EXAMPLE in packaged_traces()
    header, gpus = load_trace(EXAMPLE)
    assert header["cuda_version"] == "12.4" and len(gpus) == 2
    assert all(len(g.points) == 121 and g.points[0].t == 0.0 for g in gpus)


def test_replay_runs_the_nvml_code_path_in_trace_time() -> None:
    clock = Clock()
    col = open_replay(EXAMPLE, None, clock=clock)
    assert isinstance(col._inner, NvmlCollector)
    devs = col.devices()
    assert [d.source for d in devs] == ["replay", "replay"]
    assert devs[0].cuda_version == "12.4" and devs[0].power_limit_w == 400.0
    ticks, events = read_for(col, clock, 120)
    assert events == []
    _, gpus = load_trace(EXAMPLE)
    for d, g in zip(devs, gpus, strict=True):
        mine = [t for t in ticks if t.uuid == d.uuid]
        assert len(mine) == 120 and {t.util_method for t in mine} == {UTIL_SAMPLES}
        assert sum(t.busy_s for t in mine) == pytest.approx(busy_truth(g.points, 0, 120), abs=0.2)
        # the counter moves in 0.1 s steps: the last step may not have landed yet
        assert sum(t.energy_j for t in mine) == pytest.approx(sum(p.power_w for p in g.points[:120]), abs=0.1 * 400)
    shared = [t for t in ticks if t.uuid == devs[1].uuid][60]
    assert shared.mem_used_b - shared.proc_mem_b == 2 * 2**30 + 300 * 2**20  # someone else's 2 GiB


def test_replay_respects_visibility_and_holds_the_last_point() -> None:
    clock = Clock()
    col = open_replay(EXAMPLE, "1", clock=clock)
    (d,) = col.devices()
    assert (d.index, d.nvml_index) == (0, 1)
    clock.t += 500  # CMD outlives the 120 s trace
    ticks, _ = read_for(col, clock, 3)
    last = load_trace(EXAMPLE)[1][1].points[-1]
    assert all(t.power_w == last.power_w and t.energy_j == pytest.approx(last.power_w, rel=0.1) for t in ticks)
    assert sum(t.energy_j for t in ticks) == pytest.approx(3 * last.power_w, abs=0.1 * last.power_w)
    # samples trail the read by up to one period: each tick within a period, the sum exact but for one
    assert all(t.busy_s == pytest.approx(last.util_pct / 100, abs=0.2) for t in ticks)
    assert sum(t.busy_s for t in ticks) == pytest.approx(3 * last.util_pct / 100, abs=0.2)


def test_json_document_sparse_points_and_absent_series(tmp_path) -> None:
    doc = {
        "header": {"format": "gpuledger-gpu-trace", "gpus": [{"uuid": "GPU-h", "name": "NVIDIA H100 80GB HBM3"}]},
        "points": [
            {"t": 100.0, "gpu": 0, "util_pct": 50, "power_w": 200, "mem_used_b": 10},
            {"t": 105.0, "gpu": "GPU-h", "util_pct": 100},  # power and memory carry on
        ],
    }
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    clock = Clock()
    col = open_replay(path, None, clock=clock)
    ticks, _ = read_for(col, clock, 10)
    assert sum(t.energy_j for t in ticks) == pytest.approx(2000.0, abs=0.1 * 200)  # the held power, 0.1 s steps
    assert {t.energy_method for t in ticks} == {ENERGY_COUNTER}
    assert all(t.mem_used_b == 10 and t.temp_c is None and t.sm_clock_mhz is None for t in ticks)
    assert sum(t.busy_s for t in ticks) == pytest.approx(7.5, abs=0.2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"gpus": [{"uuid": "GPU-a"}]}\n{"t": 0, "gpu": "GPU-a", "utl_pct": 5}\n',
            "t.jsonl:2: unknown field(s) utl_pct",
        ),
        ('{"gpus": [{"uuid": "GPU-a"}]}\n{"t": 0, "gpu": "GPU-b"}\n', "t.jsonl:2: point for unknown gpu 'GPU-b'"),
        ('{"gpus": [{"uuid": "GPU-a"}]}\n{"t": 0,\n', "t.jsonl:2: not JSON"),
        ('{"t": 0, "gpu": 0}\n', "the first line must be the header"),
        ('{"gpus": []}\n', "lists no GPU"),
        ('{"sample_clock": "gpu", "gpus": [{"uuid": "GPU-a"}]}\n', "'sample_clock' must be one of wall, boot"),
    ],
)
def test_bad_traces_say_where(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_trace(path)
    col, why = open_gpu_collector({}, replay_trace=str(path))
    assert col is None and "unusable" in why


def test_open_gpu_collector_replays_a_packaged_trace() -> None:
    col, why = open_gpu_collector({"CUDA_VISIBLE_DEVICES": "GPU-a7e2"}, replay_trace=EXAMPLE)
    assert why is None and [d.uuid[:8] for d in col.devices()] == ["GPU-a7e2"]
    col.close()


def test_record_then_replay_round_trip(tmp_path) -> None:
    points = [
        TracePoint(float(t), util_pct=(t * 37) % 101, power_w=100 + (t * 53) % 250, mem_used_b=t * 1000, temp_c=50)
        for t in range(40)
    ]
    points[3].procs = {"run": (5000, 70.0), 999: (1, 1.0)}
    clock = Clock()
    fake = FakeNvml([FakeGpu("GPU-r", points=points)], clock=clock, start=clock.t)
    fake.run_pids = {31}
    live = NvmlCollector(nvml=fake, clock=clock)
    out = io.StringIO()
    n = record_trace(live, out, seconds=20, pids={31}, clock=clock, sleep=clock.sleep)
    assert n == 21  # a point per tick and a closing one
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["gpus"][0]["uuid"] == "GPU-r" and lines[4]["procs"]["run"]["mem_b"] == 5000
    path = tmp_path / "rec.jsonl"
    path.write_text(out.getvalue())

    # the recorded figures, for comparison: read the live trace again the same way
    clock2 = Clock()
    fake2 = FakeNvml([FakeGpu("GPU-r", points=points)], clock=clock2, start=clock2.t)
    recorded, _ = read_for(NvmlCollector(nvml=fake2, clock=clock2), clock2, 20)
    clock3 = Clock(T0 + 1000)
    replayed, _ = read_for(open_replay(path, None, clock=clock3), clock3, 20)
    assert len(replayed) == 20
    assert sum(t.busy_s for t in replayed) == pytest.approx(sum(t.busy_s for t in recorded), abs=0.2)
    assert sum(t.energy_j for t in replayed) == pytest.approx(sum(t.energy_j for t in recorded), rel=0.02)
    assert [t.mem_used_b for t in replayed] == [t.mem_used_b for t in recorded]
    assert [t.proc_mem_b for t in replayed][:4] == [0, 0, 5000, 5000]  # "run": whatever pids replay


def test_format_doc_lists_every_field() -> None:
    from pathlib import Path

    from gpuledger.collect import replay

    doc = (Path(__file__).resolve().parents[1] / "docs" / "replay-format.md").read_text()
    for key in replay._GPU_KEYS | replay._POINT_KEYS | replay._MIG_KEYS:
        assert f"`{key}`" in doc or f'"{key}"' in doc, key


@pytest.mark.parametrize("sample_clock", ["wall", "boot"])
def test_a_trace_chooses_the_clock_samples_are_stamped_with(tmp_path, sample_clock: str) -> None:
    # Busy, idle for 5 s (the driver stops sampling), busy again: on either clock each tick
    # records its own idle time, and busy time is the same.
    header = {"sample_clock": sample_clock, "gpus": [{"uuid": "GPU-c", "name": "NVIDIA H100 80GB HBM3"}]}
    points = [{"t": 0.0, "gpu": 0, "util_pct": 100, "power_w": 300}, {"t": 3.0, "gpu": 0, "util_pct": 0},
              {"t": 8.0, "gpu": 0, "util_pct": 100}]  # fmt: skip
    path = tmp_path / "clock.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in (header, *points)))
    clock = Clock()
    col = open_replay(path, None, clock=clock, boot=lambda: clock.t - T0 + 7_200.0)
    ticks, events = read_for(col, clock, 10)
    _, got = col.fake.nvmlDeviceGetSamples(col.fake.nvmlDeviceGetHandleByIndex(0), 1, 0)
    assert got[-1].timeStamp < (7_200 + 11) * 1e6 if sample_clock == "boot" else got[-1].timeStamp > T0 * 1e6
    assert sum(t.busy_s for t in ticks) == pytest.approx(5.0, abs=0.2)
    # No tick holds idle time from before the tick before it (samples end up to a period before
    # a read; that span is classified by the next read), not the 5 s at once.
    assert all((t.util_idle_s or 0) <= 2.0 + 1e-6 for t in ticks)
    assert sum(t.util_idle_s or 0 for t in ticks) == pytest.approx(5.0, abs=1.2)
    assert not [e for e in events if e.kind != "note"]


def test_a_trace_can_lose_a_gpu(tmp_path) -> None:
    header = {"gpus": [{"uuid": "GPU-l", "lost": [[1002.5, 1004.0]]}]}
    points = [{"t": 1000.0, "gpu": 0, "util_pct": 100, "power_w": 100}]
    path = tmp_path / "lost.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in (header, *points)))
    clock = Clock()
    ticks, events = read_for(open_replay(path, None, clock=clock), clock, 8)
    assert [(e.kind, e.t - T0) for e in events] == [("gpu_lost", 3.0), ("gpu_recovered", 4.0)]
    assert [t.t1 - T0 for t in ticks] == [1, 2, 5, 6, 7, 8]
