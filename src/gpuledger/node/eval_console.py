"""When a container's console showed an evaluation (``yolo val | predict | benchmark``).

Read line by line from a container's log (node/docker_logs.py), each line with the time the daemon
logged it: the evaluation starts at the first Ultralytics banner (``Ultralytics 8.4.190 🚀 Python-
... torch-...``, printed as the validator or predictor selects its device, before it sets the
model up) and ends at the last ``Speed: ...`` line (the validator's and predictor's summary) or
``Benchmarks complete for`` line. What runs before the banner (the interpreter's imports, a
script's own setup, ``yolo val model=X.pt`` reading the weights file) is left out of the
evaluation's window (node/discovered_eval.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EvalSpan:
    start: float | None = None  # the first banner
    end: float | None = None  # the last summary line

    def feed(self, line: str, when: float | None) -> None:
        text = line.lstrip()
        if self.start is None and text.startswith("Ultralytics ") and "🚀" in text:
            self.start = when
        elif text.startswith("Speed: ") or text.startswith("Benchmarks complete for "):
            self.end = when

    def span(self) -> tuple[float, float] | None:
        if self.start is None or self.end is None or self.end <= self.start:
            return None
        return self.start, self.end
