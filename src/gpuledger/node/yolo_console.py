"""What a YOLO training's console says about where it writes and when it started training.

Read from the screen lines of a container's log (node/docker_logs.py), escapes already removed:

* the run directory (``save_dir``), from the first of, by preference:
  ``Logging results to <dir>`` (Ultralytics' trainer, as training starts), the trainer's argument
  line ``engine/trainer: ..., save_dir=<dir>, ...``, and ``Results saved to <dir>`` (the end of a
  training, and of YOLOv5's scripts). The path is the container's: relative paths are relative to
  its working directory (node/container_mounts.py maps it to the host);
* when training started: the line ``Starting training for N epochs`` (Ultralytics and YOLOv5),
  printed right after the trainer sets its clock (``train_time_start``, from which results.csv's
  ``time`` column counts), so epoch 1 does not absorb the setup before it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LOGGING = re.compile(r"Logging results to (\S.*?)\s*$")
_ARG = re.compile(r"(?:^|[\s,:])save_dir=([^,]+?)\s*(?:,|$)")
_RESULTS = re.compile(r"Results saved to (\S.*?)\s*$")
_START = re.compile(r"Starting training for ")
_RANKS = ((_LOGGING, "Logging results to"), (_ARG, "save_dir="), (_RESULTS, "Results saved to"))
MAX_PATH = 4096


@dataclass
class TrainingFacts:
    save_dir: str | None = None  # as the container printed it
    save_dir_from: str | None = None  # which line said it
    train_started_at: float | None = None  # when "Starting training for" was logged
    _rank: int = len(_RANKS)

    def feed(self, line: str, when: float | None) -> None:
        if "Starting training for " in line and self.train_started_at is None and _START.search(line):
            self.train_started_at = when
        if "save_dir=" not in line and " to " not in line:
            return  # the common case: one substring test per line
        for rank, (pattern, name) in enumerate(_RANKS[: self._rank]):
            m = pattern.search(line)
            if m is not None and 0 < len(m.group(1)) <= MAX_PATH:
                self.save_dir, self.save_dir_from, self._rank = m.group(1), name, rank
                return
