"""The end of a ``gpuledger run`` (integrations/ultralytics/postrun.py) on captured logs.

A stand-in session keeps these tests independent of collectors; the real wiring is exercised by
test_yolo_training.py.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuledger.core.model import Event, HostInterval, Metric
from gpuledger.integrations.ultralytics import postrun
from gpuledger.recorder.messages import handle

DATA = Path(__file__).parent / "data" / "yolo"
GIB = 2**30


class Recorder:
    def __init__(self, rss_b: int = GIB) -> None:
        self.events: list[Event] = []
        self.metrics: list[Metric] = []
        self.pending = SimpleNamespace(host=[HostInterval(seq=0, t0=0.0, t1=1.0, rss_max_b=rss_b)])

    def event(self, kind: str, message: str = "", **payload: object) -> None:
        self.events.append(Event(t=0.0, kind=kind, message=message, payload=payload))

    def add_metrics(self, metrics: list[Metric]) -> None:
        self.metrics.extend(metrics)

    def cut(self) -> None:
        raise AssertionError("in-process messages never cut")


class Session:
    def __init__(self, log: str, rss_b: int = GIB) -> None:
        self.run = SimpleNamespace(id="run", meta={})
        self.log = (DATA / f"{log}.log").read_bytes()
        self.recorder = Recorder(rss_b)

    def ledger(self) -> None:
        raise OSError("ledger unreachable")  # the pending intervals still count


def test_yolov5_output_becomes_epoch_metrics() -> None:
    session = Session("yolov5_v7")
    assert postrun.explain_run(session, session.log, "succeeded", 0, None) is None
    assert sorted({m.epoch for m in session.recorder.metrics}) == [1, 2, 3]
    [parsed] = [e for e in session.recorder.events if e.kind == "log_parsed"]
    assert parsed.payload["format"] == "yolov5" and parsed.payload["epochs"] == 3


def test_failure_events_and_reason() -> None:
    session = Session("fail_nan_persisted")
    reason = postrun.explain_run(session, session.log, "failed", 1, None)
    assert reason.startswith("loss became NaN/Inf at epoch 2/4")
    [nan] = [e for e in session.recorder.events if e.kind == "nan_loss"]
    assert nan.payload["epoch"] == 2 and nan.payload["source"] == "log" and nan.payload["fatal"]
    assert {m.epoch for m in session.recorder.metrics} == {1}


def test_no_log_parsing_when_the_callbacks_reported_epochs() -> None:
    session = Session("yolov8n_detect")
    handle(session, session.recorder, {"type": "epoch_end", "t": 1.0, "epoch": 1, "metrics": {"x": 1}}, cut=False)
    postrun.explain_run(session, session.log, "succeeded", 0, None)
    assert [m.key for m in session.recorder.metrics] == ["x"]


def test_sigkill_at_the_memory_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postrun, "memory_limit_b", lambda: 8 * GIB)
    session = Session("fail_sigkill_epoch4", rss_b=int(7.9 * GIB))
    reason = postrun.explain_run(session, session.log, "killed", None, 9)
    assert reason.startswith("killed by SIGKILL with peak RSS 7.9 GiB of a 8.0 GiB limit")
    assert [e.payload["epoch"] for e in session.recorder.events if e.kind == "oom_killed"] == [4]


def test_missing_log_explains_nothing() -> None:
    session = Session("yolov8n_detect")  # no log file: the session hands over no bytes
    assert postrun.explain_run(session, b"", "failed", 1, None) is None
    assert session.recorder.events == [] and session.recorder.metrics == []


def test_memory_limit_is_known_here() -> None:
    limit = postrun.memory_limit_b()
    assert limit is None or limit > 2**20
