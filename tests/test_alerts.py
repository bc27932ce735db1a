"""Live alerts: the pure evaluator, the config file, the webhook sender and the recorder hook."""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest

from diag_support import GIB, T0, device, gpu_intervals
from gpuledger.core.diagnosis.alerts import AlertEngine, AlertRules, rules_from_config
from gpuledger.core.model import GpuTick, HostTick, RunRecord
from gpuledger.recorder.alerting import LiveAlerts, load_rules
from gpuledger.recorder.webhook import WebhookSender


def engine(**rules) -> AlertEngine:
    return AlertEngine(AlertRules(**rules), [device(0, memory_gib=80)])


# -- evaluator ------------------------------------------------------------------------------------


def test_low_utilisation_fires_once_the_streak_is_long_enough_then_repeats() -> None:
    e = engine(low_util_minutes=10, repeat_minutes=30)
    ivs = gpu_intervals("GPU-test-0", 720, step=5.0, util=lambda i: 0.02)  # an hour at 2 %
    fired = [a for iv in ivs for a in e.on_interval([iv])]
    assert [round((a.t - T0) / 60) for a in fired] == [10, 40]
    assert fired[0].rule == "low_util" and fired[0].gpu == 0 and "10 min" in fired[0].message


def test_low_utilisation_streak_resets_when_the_gpu_works() -> None:
    e = engine(low_util_minutes=10)
    dips = gpu_intervals("GPU-test-0", 720, step=5.0, util=lambda i: 0.9 if i % 100 == 99 else 0.02)
    assert [a for iv in dips for a in e.on_interval([iv])] == []  # streaks of 8 min 15 s only


def test_vram_and_temperature_alerts() -> None:
    e = engine(repeat_minutes=30)
    full = gpu_intervals("GPU-test-0", 3, mem_gib=lambda i: 77.0, temp=lambda i: 88.0)
    fired = [a for iv in full for a in e.on_interval([iv])]
    assert sorted(a.rule for a in fired) == ["temperature", "vram"]  # once each: repeats wait 30 min
    vram = next(a for a in fired if a.rule == "vram")
    assert vram.payload == {"used_b": 77 * GIB, "total_b": 80 * GIB} and "96.2 %" in vram.message
    assert [a for iv in gpu_intervals("GPU-test-0", 3) for a in engine().on_interval([iv])] == []


def test_oom_and_nan_alerts() -> None:
    e = engine()
    assert e.on_event("cuda_oom", "CUDA out of memory", {"gpu": 0}, T0)[0].rule == "oom"
    assert e.on_event("epoch_end", "epoch 3 ended", {}, T0) == []
    nan = e.on_metrics({"train/box_loss": float("nan"), "lr/pg0": 0.01}, T0, epoch=3)
    assert nan[0].rule == "nan_loss" and nan[0].payload["keys"] == ["train/box_loss"]
    assert engine(nan_loss=False, oom=False).on_event("cuda_oom", "x", {}, T0) == []


# -- config ---------------------------------------------------------------------------------------


def test_config_file_maps_to_rules(tmp_path: Path) -> None:
    path = tmp_path / "alerts.toml"
    path.write_text(
        '[alerts]\nwebhook = "https://hooks.example.org/T1"\nrepeat_minutes = 5\n'
        "[alerts.low_util]\nbelow_pct = 20\nminutes = 3\n[alerts.vram]\nenabled = false\n"
        "[alerts.temperature]\nabove_c = 80\n"
    )
    rules = load_rules({"GPULEDGER_ALERTS": str(path)})
    assert rules == AlertRules(
        low_util_pct=20,
        low_util_minutes=3,
        vram=False,
        temp_c=80,
        repeat_minutes=5,
        webhook="https://hooks.example.org/T1",
    )
    assert load_rules({"GPULEDGER_HOME": str(tmp_path / "none")}) == AlertRules()  # no file: defaults
    assert rules_from_config({"alerts": {"enabled": False}}) is None


@pytest.mark.parametrize(
    "config",
    [
        {"alerts": {"low_util": {"below": 5}}},
        {"alerts": {"vrma": {}}},
        {"alerts": {"vram": {"above_pct": "high"}}},
        {"alerts": {"webhook": "ftp://x"}},
    ],
)
def test_config_mistakes_are_errors(config: dict) -> None:
    with pytest.raises(ValueError):
        rules_from_config(config)


def test_a_broken_config_warns_and_keeps_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "alerts.toml"
    path.write_text("[alerts.low_util]\nbelow = 5\n")
    lines: list[str] = []
    live = LiveAlerts.for_session(_run(), [device(0)], lines.append, env={"GPULEDGER_ALERTS": str(path)})
    assert live.engine is not None and live.engine.rules == AlertRules()
    assert "alert config ignored" in lines[0]


# -- webhook --------------------------------------------------------------------------------------


class _Hook(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[dict]] = []
    fail_first = 0
    delay_s = 0.0

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(type(self).delay_s)
        if type(self).fail_first > 0:
            type(self).fail_first -= 1
            self.send_response(500)
            self.end_headers()
            return
        type(self).received.append(body)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hook():
    handler = type("Hook", (_Hook,), {"received": [], "fail_first": 0, "delay_s": 0.0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler, f"http://127.0.0.1:{server.server_port}/hook"
    server.shutdown()
    server.server_close()


def test_webhook_retries_with_backoff_then_delivers(hook) -> None:
    handler, url = hook
    handler.fail_first = 2
    sender = WebhookSender(url, backoff_s=(0.05, 0.1, 0.2))
    assert sender.send({"rule": "vram", "message": "full"})
    sender.close(timeout_s=5)
    assert handler.received == [{"rule": "vram", "message": "full"}]
    assert sender.sent == 1 and sender.failed == 0


def test_webhook_gives_up_and_reports(hook) -> None:
    handler, url = hook
    handler.fail_first = 99
    errors: list[str] = []
    sender = WebhookSender(url, on_error=errors.append, backoff_s=(0.01, 0.01))
    sender.send({"rule": "oom"})
    sender.close(timeout_s=5)
    assert sender.failed == 1 and "failed after retries" in errors[0]


def test_webhook_never_blocks_and_drops_when_the_queue_is_full(hook) -> None:
    handler, url = hook
    handler.delay_s = 0.5  # a slow endpoint
    sender = WebhookSender(url, queue_size=3, backoff_s=())
    started = time.perf_counter()
    results = [sender.send({"n": i}) for i in range(10)]
    assert time.perf_counter() - started < 0.05  # send() only queues
    assert results.count(False) >= 6 and sender.dropped == results.count(False)
    sender.close(timeout_s=0.1)


# -- the recorder hook ----------------------------------------------------------------------------


def _run() -> RunRecord:
    return RunRecord(
        id="0190abcd-0000-7000-8000-000000000009",
        command=["train"],
        user="u",
        host="h",
        cwd="/",
        started_at=T0,
        name="nightly",
        labels={"project": "det"},
    )


class _Host:
    def read(self, now: float, closes_interval: bool = False) -> HostTick:
        return HostTick(t0=now - 1, t1=now, cpu_s=0.5, rss_b=GIB, read_b=0, write_b=0, threads=4, procs=1)

    def pids(self) -> set[int]:
        return {1}

    def close(self) -> None:
        pass


class _Gpu:
    """A GPU that idles at 1 % with its memory nearly full."""

    def devices(self):
        return [device(0, memory_gib=80)]

    def read(self, pids, now, closes_interval=True, final=False):
        from gpuledger.collect.base import GpuRead

        tick = GpuTick(uuid="GPU-test-0", t0=now - 60, t1=now, busy_s=0.6, mem_used_b=79 * GIB, temp_c=50.0)
        return GpuRead(ticks=[tick])

    def close(self) -> None:
        pass


def test_live_alerts_through_a_real_recorder(hook) -> None:
    from gpuledger.recorder.recorder import Recorder

    handler, url = hook
    clock = [T0]
    lines: list[str] = []
    live = LiveAlerts(
        _run(),
        [device(0, memory_gib=80)],
        AlertRules(low_util_minutes=3, webhook=url),
        lines.append,
        WebhookSender(url),
    )
    seen_by_next_hook: list[int] = []
    rec = Recorder(
        lambda *batch: None,
        host=_Host(),
        gpu=_Gpu(),
        interval_s=60,
        clock=lambda: clock[0],
        on_interval=live.hook(lambda gpu, host: seen_by_next_hook.append(len(gpu))),
    )
    live.bind(rec)
    for _ in range(4):  # four one-minute intervals
        clock[0] += 60
        rec.cut()
    live.on_message({"type": "event", "kind": "cuda_oom", "message": "CUDA out of memory", "payload": {"epoch": 2}})
    live.on_message({"type": "epoch_end", "epoch": 2, "metrics": {"train/box_loss": "nan"}})
    live.close(timeout_s=5)
    rules = [a.rule for a in live.fired]
    assert rules == ["vram", "low_util", "oom", "nan_loss"]
    assert seen_by_next_hook == [1, 1, 1, 1]  # the hook's other consumer still sees every interval
    alerts = [e for e in rec.pending.events if e.kind == "alert"]
    assert [e.payload["rule"] for e in alerts] == rules
    assert all(line.startswith("gpuledger: ALERT ") for line in lines) and len(lines) == 4
    assert '"nightly"' in lines[0]
    assert [b["rule"] for b in handler.received] == rules
    assert handler.received[0]["run"]["project"] == "det" and handler.received[0]["source"] == "gpuledger"
