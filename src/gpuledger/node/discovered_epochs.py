"""The epochs of a discovered run: from results.csv when its run directory is mounted, else the console.

At each look (every interval boundary, and once more at the run's end) the agent hands the
container log's view (node/docker_logs.py) and the container's mounts. In order of preference:

1. **results.csv** — when the run directory the console named (node/yolo_console.py) maps to the
   host (node/container_mounts.py): every column at the precision Ultralytics wrote, each epoch's
   ``epoch_end`` dated ``train start + time`` (results.csv's own clock, started as training
   started), and args.yaml as the run's metadata;
2. **the console** — otherwise, or for epochs results.csv does not have when the run ends: the
   columns the console shows, rounded as it rounds them, dated when the log showed the epoch
   finished. The run's metadata says which (``epochs_source``), and each ``epoch_end`` event too.

Epoch 1 starts when the console said ``Starting training for``: an ``epoch_start`` there keeps
the setup before it (imports, dataset scan, model build) out of epoch 1. Rows of results.csv
before the first epoch this container trained (a resumed training's earlier epochs) are not taken.
An agent restarted reads the container's log again from its first line and takes its epochs
again, at the same times: the ledger keeps an event or metric identical to one it holds once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuledger.core.model import Metric
from gpuledger.core.redaction.records import redact_run_fields
from gpuledger.core.redaction.redact import Redactor
from gpuledger.integrations.ultralytics import describe
from gpuledger.node.container_mounts import ContainerFs, HostPath, to_host
from gpuledger.node.yolo_rundir import args_meta, results_rows, run_args

FROM_CSV = "results.csv"
FROM_CONSOLE = "console (approximate)"


@dataclass
class Taken:
    """What one look found: metrics, events as (t, kind, message, payload), and metadata to merge."""

    metrics: list[Metric] = field(default_factory=list)
    events: list[tuple[float, str, str, dict[str, Any]]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


class EpochTaker:
    """One discovered run's epochs, taken once each (module doc)."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        self._redactor = redactor or Redactor.default()
        self.ended: set[int] = set()  # epochs with an epoch_end
        self.from_csv: set[int] = set()  # epochs whose metrics came from results.csv
        self.started = False  # epoch_start of the first epoch written
        self.where: HostPath | None = None
        self._save_dir: str | None = None
        self._args_read = False
        self._source: str | None = None
        self._said_dir: str | None = None

    def take(self, view: Any, fs: ContainerFs | None, now: float, final: bool = False) -> Taken:
        out = Taken()
        facts = view.training
        if facts.save_dir != self._save_dir and fs is not None:
            self._save_dir, self.where = facts.save_dir, to_host(facts.save_dir, fs) if facts.save_dir else None
        rows = results_rows(self.where) if self.where is not None else None
        if rows is not None and not self._args_read:
            args = run_args(self.where)  # type: ignore[arg-type]
            if args is not None:
                self._args_read = True
                out.meta.update(args_meta(args, self._save_dir or ""))
        first = min((e for e in view.parsed.line_epochs if e is not None), default=None)
        start = facts.train_started_at
        for row in rows or ():
            epoch = int(row["epoch"])
            if epoch in self.from_csv or (first is not None and epoch < first):
                continue
            t = start + row["time"] if start is not None and "time" in row else view.epoch_times.get(epoch, now)
            self.from_csv.add(epoch)
            out.metrics += [Metric(t=t, key=k, value=v, epoch=epoch) for k, v in describe.epoch_metrics(row).items()]
            self._end(out, epoch, t, FROM_CSV)
        if rows is None or final:  # the console's figures, for what results.csv did not give
            for ep in view.parsed.epochs:
                if ep.epoch in self.ended:  # from results.csv, or taken at an earlier look
                    continue
                t = view.epoch_times.get(ep.epoch, now)
                out.metrics += [Metric(t=t, key=k, value=v, epoch=ep.epoch) for k, v in ep.metrics.items()]
                self._end(out, ep.epoch, t, FROM_CONSOLE)
        if not self.started and start is not None and self.ended:
            self.started = True
            epoch = min(self.ended)
            out.events.append((start, "epoch_start", f"epoch {epoch} started", {"epoch": epoch, "source": "log"}))
        source = FROM_CSV if self.from_csv else FROM_CONSOLE if self.ended else None
        if source != self._source:
            self._source = source
            out.meta["epochs_source"] = source
        if self._save_dir and self._save_dir != self._said_dir:
            self._said_dir = self._save_dir
            out.meta["save_dir"] = self._save_dir
            out.meta["save_dir_host"] = str(self.where) if self.where is not None else None
        if out.meta:
            out.meta = redact_run_fields(self._redactor, {"meta": out.meta})["meta"]
        return out

    def _end(self, out: Taken, epoch: int, t: float, source: str) -> None:
        if epoch in self.ended:
            return
        self.ended.add(epoch)
        origin = "results.csv" if source == FROM_CSV else "log"
        out.events.append((t, "epoch_end", f"epoch {epoch} ended", {"epoch": epoch, "source": origin}))
