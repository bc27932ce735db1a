"""The Python API: meter the current process the way ``gpuledger run`` meters a command.

import gpuledger

with gpuledger.track(project="detector", team="vision") as run:
    train()
    run.log_metric("map50_95", 0.41, epoch=3)
print(run.summary["busy_gpu_hours"])
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from gpuledger.core.model import Metric
from gpuledger.recorder.recorder import ticks_per_interval
from gpuledger.recorder.session import Session, new_run_record


class TrackedRun:
    """Handle on the run being recorded; ``summary`` is filled when the block ends."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self.id = session.run.id
        self.summary: dict | None = None

    def log_metric(self, key: str, value: float, epoch: int | None = None, step: int | None = None) -> None:
        self._session.recorder.add_metrics([Metric(t=time.time(), key=key, value=float(value), epoch=epoch, step=step)])

    def log_metrics(self, values: Mapping[str, float], epoch: int | None = None, step: int | None = None) -> None:
        now = time.time()
        self._session.recorder.add_metrics(
            [Metric(t=now, key=k, value=float(v), epoch=epoch, step=step) for k, v in values.items()]
        )

    def event(self, kind: str, message: str = "", **payload: object) -> None:
        self._session.recorder.event(kind, message, **payload)


@contextmanager
def track(
    name: str | None = None,
    project: str | None = None,
    team: str | None = None,
    labels: Mapping[str, str] | None = None,
    interval: float = 5.0,
    db: str | None = None,
    no_gpu: bool = False,
    replay_gpus: str | None = None,
) -> Iterator[TrackedRun]:
    """Record this process (and the processes it starts) as one run until the block ends.

    The run ends ``succeeded``, ``failed`` (an exception escaped; the reason names it) or
    ``killed`` (KeyboardInterrupt). Exceptions are never swallowed.
    """
    from gpuledger.collect.gpus import open_gpu_collector
    from gpuledger.collect.host import ProcessTreeCollector
    from gpuledger.integrations.ultralytics.sink import active_session

    env = dict(os.environ)
    all_labels = dict(labels or {})
    if project:
        all_labels["project"] = project
    if team:
        all_labels["team"] = team
    run = new_run_record(
        [sys.executable, *sys.argv],
        env=env,
        cwd=os.getcwd(),
        name=name,
        labels=all_labels,
        interval_s=interval,
        replayed=replay_gpus is not None,
    )
    if no_gpu:
        gpu, note = None, "GPU metering was turned off (no_gpu=True)"
    else:
        gpu, note = open_gpu_collector(env, replay_trace=replay_gpus)
    host = ProcessTreeCollector(os.getpid(), include_root=True, system_every=ticks_per_interval(interval))
    session = Session(db or env.get("GPULEDGER_DB"), run, host=host, gpu=gpu, gpu_note=note)
    previous_run_env = os.environ.get("GPULEDGER_RUN_ID")
    os.environ["GPULEDGER_RUN_ID"] = run.id  # integrations in this process attach to this run
    handle = TrackedRun(session)
    session.start()
    status, reason = "succeeded", None
    try:
        with active_session(session):  # integrations in this process (attach) report to this run
            yield handle
    except KeyboardInterrupt:
        status, reason = "killed", "interrupted (KeyboardInterrupt)"
        raise
    except SystemExit as exc:
        if exc.code not in (None, 0):
            status, reason = "failed", f"exited with code {exc.code}"
        raise
    except BaseException as exc:
        status, reason = "failed", f"{type(exc).__name__}: {exc}"[:500]
        raise
    finally:
        try:
            handle.summary = session.finish(status, exit_code=0 if status == "succeeded" else None, reason=reason)
            session.close()
        finally:  # even when finishing failed: later code in this process is no longer in the run
            if previous_run_env is None:
                os.environ.pop("GPULEDGER_RUN_ID", None)
            else:
                os.environ["GPULEDGER_RUN_ID"] = previous_run_env
