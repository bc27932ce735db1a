"""The Prometheus exporter of a recording run, and the same figures read back from a ledger."""

from __future__ import annotations

import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuledger.core.model import GpuIdentity, GpuInterval, HostInterval, RunRecord
from gpuledger.prom import names as n
from gpuledger.prom import serve
from gpuledger.prom.families import SnapshotCollector
from gpuledger.prom.ledger_source import LedgerSource
from gpuledger.prom.live import LiveRun
from gpuledger.store import Ledger

GIB = 2**30
DESIGN_NAMES = {  # the agreed names (docs/PROMETHEUS.md), verbatim
    "gpuledger_gpu_busy_seconds_total",
    "gpuledger_gpu_energy_joules_total",
    "gpuledger_gpu_power_watts",
    "gpuledger_gpu_memory_used_bytes",
    "gpuledger_gpu_temperature_celsius",
    "gpuledger_gpu_throttle_seconds_total",
    "gpuledger_run_cpu_seconds_total",
    "gpuledger_run_info",
}


def _run(run_id: str = "01900000-0000-7000-8000-000000000001", **kw) -> RunRecord:
    base = dict(
        id=run_id,
        command=["python", "train.py"],
        user="ann",
        host="node-7",
        cwd="/w",
        started_at=1000.0,
        labels={"project": "vision", "team": "cv"},
        name="yolo-s",
    )
    base.update(kw)
    return RunRecord(**base)


DEVICES = [
    GpuIdentity(index=0, uuid="GPU-a", name="NVIDIA A100-SXM4-80GB", memory_total_b=80 * GIB),
    GpuIdentity(index=1, uuid="GPU-b", name="NVIDIA A100-SXM4-80GB", memory_total_b=80 * GIB),
]


def _intervals() -> list[tuple[list[GpuInterval], HostInterval]]:
    out = []
    for seq in range(3):
        t0 = 1000.0 + 5 * seq
        gpu = [
            GpuInterval(
                "GPU-a",
                seq,
                t0,
                t0 + 5,
                samples=5,
                busy_s=2.5,
                energy_j=1250.0,
                power_max_w=260.0 + seq,
                mem_used_last_b=(20 + seq) * GIB,
                temp_max_c=60.0 + seq,
                throttle_s={"power": 1.0, "thermal": 0.0},
            ),
            # GPU b: no energy counter, no temperature (absent, never 0)
            GpuInterval("GPU-b", seq, t0, t0 + 5, samples=5, busy_s=4.0, power_max_w=300.0, mem_used_last_b=40 * GIB),
        ]
        out.append((gpu, HostInterval(seq, t0, t0 + 5, samples=5, cpu_s=1.5)))
    return out


def _exposition(source) -> dict[str, list]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(source))
    text = generate_latest(registry).decode()
    samples: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples.setdefault(s.name, []).append(s)
    return samples


def _value(samples: dict[str, list], name: str, **labels: str) -> float:
    found = [s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


def test_counters_are_running_sums_and_gauges_the_latest_interval() -> None:
    live = LiveRun()
    live.bind(_run(), DEVICES)
    for gpu, host in _intervals():
        live.observe(gpu, host)
    s = _exposition(live.snapshot)
    assert _value(s, "gpuledger_gpu_busy_seconds_total", gpu="0", uuid="GPU-a") == 7.5
    assert _value(s, "gpuledger_gpu_busy_seconds_total", gpu="1") == 12.0
    assert _value(s, "gpuledger_gpu_energy_joules_total", gpu="0") == 3750.0
    assert _value(s, "gpuledger_gpu_throttle_seconds_total", gpu="0", reason="power") == 3.0
    assert _value(s, "gpuledger_gpu_throttle_seconds_total", gpu="0", reason="thermal") == 0.0
    assert _value(s, "gpuledger_run_cpu_seconds_total") == 4.5
    assert _value(s, "gpuledger_gpu_power_watts", gpu="0") == 262.0
    assert _value(s, "gpuledger_gpu_memory_used_bytes", gpu="0") == 22 * GIB
    assert _value(s, "gpuledger_gpu_memory_total_bytes", gpu="1") == 80 * GIB
    assert _value(s, "gpuledger_gpu_temperature_celsius", gpu="0") == 62.0
    assert _value(s, "gpuledger_run_start_time_seconds") == 1000.0
    info = s["gpuledger_run_info"]
    assert [x.value for x in info] == [1.0]
    assert info[0].labels == {
        "run_id": _run().id,
        "project": "vision",
        "team": "cv",
        "user": "ann",
        "name": "yolo-s",
        "status": "running",
        "replayed": "false",
    }
    # absent is not zero: GPU b measured neither energy nor temperature
    assert not [x for x in s["gpuledger_gpu_energy_joules_total"] if x.labels["gpu"] == "1"]
    assert not [x for x in s["gpuledger_gpu_temperature_celsius"] if x.labels["gpu"] == "1"]
    assert "gpuledger_run_end_time_seconds" not in s


def test_names_and_labels_follow_the_design() -> None:
    live = LiveRun()
    live.bind(_run(), DEVICES)
    for gpu, host in _intervals():
        live.observe(gpu, host)
    s = _exposition(live.snapshot)
    assert set(s) >= DESIGN_NAMES
    assert set(s) <= n.EXPOSED_NAMES
    for name, samples in s.items():
        for sample in samples:
            assert "host" not in sample.labels and "hostname" not in sample.labels
            if name.startswith("gpuledger_gpu_"):
                assert {"gpu", "uuid", "run_id", "project", "team", "user"} <= set(sample.labels)
            elif name != "gpuledger_run_info":
                assert set(sample.labels) == {"run_id", "project", "team", "user"}


def test_user_text_in_labels_is_escaped_and_cut() -> None:
    live = LiveRun()
    live.bind(_run(name='evil"} 1\ngpuledger_fake 2 ' + "x" * 500, labels={"project": "a\\b"}), [])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(live.snapshot))
    text = generate_latest(registry).decode()
    assert "\ngpuledger_fake" not in text
    info = [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == "gpuledger_run_info"]
    assert info[0].labels["project"] == "a\\b"
    assert info[0].labels["name"].startswith('evil"} 1\ngpuledger_fake 2 x')
    assert len(info[0].labels["name"]) == n.MAX_LABEL_CHARS


def test_labels_follow_the_run_record_and_an_ended_run_has_an_end_time() -> None:
    run = _run(labels={})
    live = LiveRun()
    live.bind(run, DEVICES)
    run.labels["project"] = "late"  # an integration fills it after the start
    run.status, run.ended_at = "failed", 1100.0
    s = _exposition(live.snapshot)
    assert s["gpuledger_run_info"][0].labels["project"] == "late"
    assert s["gpuledger_run_info"][0].labels["status"] == "failed"
    assert _value(s, "gpuledger_run_end_time_seconds") == 1100.0


def test_the_http_endpoint_serves_the_run_and_stops() -> None:
    server = serve.start(0)
    try:
        server.live.bind(_run(), DEVICES)
        for gpu, host in _intervals():
            server.live.observe(gpu, host)
        assert server.host == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
            assert resp.headers["Content-Type"].startswith("text/plain")
        assert 'gpuledger_gpu_busy_seconds_total{gpu="0"' in body
        assert "python_gc" not in body and "process_cpu" not in body  # only this run, no global registry
    finally:
        server.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=2)


def test_a_busy_port_is_a_warning_not_an_error() -> None:
    first = serve.start(0)
    try:
        lines: list[str] = []
        assert serve.try_start(first.port, "127.0.0.1", lines.append) is None
        assert len(lines) == 1 and "cannot serve Prometheus metrics" in lines[0]
    finally:
        first.stop()


def test_the_ledger_gives_the_same_figures_as_the_live_exporter(ledger_url: str) -> None:
    run = _run()
    live = LiveRun()
    live.bind(run, DEVICES)
    with Ledger(ledger_url) as ledger:
        ledger.create_run(run)
        ledger.add_devices(run.id, DEVICES)
        for gpu, host in _intervals():
            live.observe(gpu, host)
            ledger.append(run.id, gpu, [host], [], [])
        from_db = LedgerSource(ledger, clock=lambda: 1020.0).figures()
    assert from_db == live.snapshot()


def test_the_ledger_source_keeps_recent_runs_and_the_readers_projects(ledger_url: str) -> None:
    now = time.time()
    runs = {
        "running": _run("01900000-0000-7000-8000-00000000000a", started_at=now - 50),
        "ended_recently": _run(
            "01900000-0000-7000-8000-00000000000b", started_at=now - 900, status="failed", ended_at=now - 600
        ),
        "ended_long_ago": _run(
            "01900000-0000-7000-8000-00000000000c", started_at=now - 9000, status="succeeded", ended_at=now - 8000
        ),
        "other_project": _run(
            "01900000-0000-7000-8000-00000000000d", started_at=now - 40, labels={"project": "secret", "team": "x"}
        ),
    }
    with Ledger(ledger_url) as ledger:
        for r in runs.values():
            ledger.create_run(r)
        source = LedgerSource(ledger, clock=lambda: now)
        everything = source.figures()
        scoped = source.figures(frozenset({"vision"}))
        nothing = source.figures(frozenset())
        capped = LedgerSource(ledger, max_runs=1, clock=lambda: now).figures()
    ids = {k: r.id for k, r in runs.items()}
    assert [f.key.run_id for f in everything] == [ids["other_project"], ids["running"], ids["ended_recently"]]
    assert [f.key.run_id for f in scoped] == [ids["running"], ids["ended_recently"]]
    assert nothing == []
    assert [f.key.run_id for f in capped] == [ids["other_project"]]
    ended = next(f for f in everything if f.key.run_id == ids["ended_recently"])
    assert ended.status == "failed" and ended.ended_at == pytest.approx(now - 600)
    assert ended.gpus == [] and ended.cpu_s is None


def _gpu_iv(uuid: str, seq: int, busy: float = 1.0) -> GpuInterval:
    t0 = 1000.0 + seq
    return GpuInterval(
        uuid, seq, t0, t0 + 1, samples=1, busy_s=busy, energy_j=0.1, power_max_w=100.0 + seq, throttle_s={"power": 0.25}
    )


def test_a_replayed_run_is_marked_in_run_info_live_and_from_the_ledger(ledger_url: str) -> None:
    run = _run(replayed=True)
    live = LiveRun()
    live.bind(run, DEVICES)
    with Ledger(ledger_url) as ledger:
        ledger.create_run(run)
        ledger.add_devices(run.id, DEVICES)
        from_db = _exposition(LedgerSource(ledger, clock=lambda: 1020.0).figures)
    for s in (_exposition(live.snapshot), from_db):
        assert s["gpuledger_run_info"][0].labels["replayed"] == "true"  # not mistaken for real hardware


def test_later_scrapes_read_only_new_intervals_and_sums_stay_exact(ledger_url: str) -> None:
    run = _run()
    with Ledger(ledger_url) as ledger:
        ledger.create_run(run)
        ledger.add_devices(run.id, DEVICES[:1])
        ledger.append(run.id, [_gpu_iv("GPU-a", s, 0.1) for s in range(50)], [], [], [])
        source = LedgerSource(ledger, clock=lambda: 1100.0)
        first = source.figures()[0].gpus[0]
        assert source.rows_read == 0  # a run new to the process is summed in SQL
        assert first.busy_s == 5.0  # 50 x 0.1, exact (integer micro-seconds), not 5.000000000000002
        assert first.throttle_s == {"power": 12.5} and first.power_w == 149.0
        ledger.append(run.id, [_gpu_iv("GPU-a", s, 0.1) for s in range(50, 53)], [], [], [])
        second = source.figures()[0].gpus[0]
        assert source.rows_read == 3  # only the new intervals
        assert second.busy_s == 5.3 and second.energy_j == pytest.approx(5.3) and second.power_w == 152.0
        source.figures()
        assert source.rows_read == 0  # nothing new, nothing read
        # A fresh process (another replica) reading everything publishes the very same value.
        assert LedgerSource(ledger, clock=lambda: 1100.0).figures()[0].gpus[0].busy_s == second.busy_s


def test_a_late_interval_is_waited_for_then_a_lost_one_skipped(ledger_url: str) -> None:
    run = _run()
    now = [1100.0]
    with Ledger(ledger_url) as ledger:
        ledger.create_run(run)
        ledger.add_devices(run.id, DEVICES[:1])
        ledger.append(run.id, [_gpu_iv("GPU-a", 0), _gpu_iv("GPU-a", 1), _gpu_iv("GPU-a", 3)], [], [], [])
        source = LedgerSource(ledger, gap_grace_s=60, clock=lambda: now[0])
        assert source.figures()[0].gpus[0].busy_s == 2.0  # seq 2 is missing: wait before adding seq 3
        ledger.append(run.id, [_gpu_iv("GPU-a", 2)], [], [], [])  # it arrives late: counted, in order
        assert source.figures()[0].gpus[0].busy_s == 4.0
        ledger.append(run.id, [_gpu_iv("GPU-a", 5)], [], [], [])  # seq 4 never comes
        assert source.figures()[0].gpus[0].busy_s == 4.0
        now[0] += 61
        assert source.figures()[0].gpus[0].busy_s == 5.0  # after the grace period the gap is skipped


def test_throttle_reasons_are_the_ones_the_nvml_collector_records() -> None:
    from gpuledger.collect import nvml_throttle

    recorded = {name for name, _, _ in nvml_throttle.POLICIES} | set(nvml_throttle.REASON_BITS.values())
    assert recorded == set(n.THROTTLE_REASONS)


def test_a_missing_prometheus_client_is_a_warning_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails as when not installed
    lines: list[str] = []
    assert serve.try_start(0, "127.0.0.1", lines.append) is None
    assert len(lines) == 1 and "gpuledger[prometheus]" in lines[0]
