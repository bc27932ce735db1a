"""Epoch metrics from a YOLO training's console output, for runs the callbacks could not see.

Works on what CMD wrote to its terminal: progress bars redrawn with ``\\r``, ANSI colours. Two
families are understood:

- **Ultralytics** 8.x / YOLO11 / YOLO26 (``yolo train``, ``model.train()``), every task: the train
  header (``Epoch GPU_mem box_loss ... Instances Size``) names the loss columns, so new loss names
  (``l1_loss``, ``rle_loss`` ...) need no code; ``Box(P R mAP50 mAP50-95)`` becomes
  ``metrics/precision(B)`` ... as in results.csv. Epochs are printed 1-based (``1/100``).
- **YOLOv5** repository scripts (v6 ``gpu_mem box obj cls labels img_size`` and v7 ``GPU_mem box_loss
  obj_loss ...``), detect and segment: epochs are printed 0-based (``0/99``), metric names follow
  YOLOv5's results.csv (``metrics/mAP_0.5``).

Epoch numbers returned are always 1-based, as in Ultralytics' results.csv. An epoch counts as done
once the output shows training went past it (a later epoch, or "N epochs completed"), so the epoch
a crash interrupted is not reported as finished. The console shows fewer digits than results.csv
(losses ``%.4g``, metrics ``%.3g``) and no validation losses or learning rates: parsed figures are
the console's, not a substitute for the callbacks.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_PROGRESS = re.compile(r"^\s*(\d+)/(\d+)\s")  # "  12/100  ..." : an epoch's train progress line
_PERCENT = re.compile(r"^(.*?):\s*(\d{1,3})%")  # description before tqdm's "NN%"
_COMPLETED = re.compile(r"\d+ epochs? completed in")
_COUNT_COLUMNS = {"instances", "labels", "targets", "size", "img_size"}
_V6_LOSSES = {"box": "box_loss", "obj": "obj_loss", "cls": "cls_loss", "total": "total_loss", "giou": "giou_loss"}
_GROUP_SUFFIX = {"box": "B", "mask": "M", "pose": "P"}
_ULTRALYTICS_VAL = {"P": "precision", "R": "recall", "mAP50": "mAP50", "mAP50-95": "mAP50-95"}
_YOLOV5_VAL = {
    "P": "precision",
    "R": "recall",
    "mAP50": "mAP_0.5",
    "mAP50-95": "mAP_0.5:0.95",
    "mAP@.5": "mAP_0.5",
    "mAP@.5:.95": "mAP_0.5:0.95",
}
_FIRST_WORDS = frozenset({"Epoch", "all"})  # first words of a train header and a validation result
_CLASSIFY_VAL = {"top1_acc": "metrics/accuracy_top1", "top5_acc": "metrics/accuracy_top5"}

ULTRALYTICS = "ultralytics"
YOLOV5 = "yolov5"


@dataclass
class ParsedEpoch:
    epoch: int  # 1-based
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class ParsedLog:
    format: str | None = None  # ULTRALYTICS, YOLOV5, or None when no training output was recognised
    epochs: list[ParsedEpoch] = field(default_factory=list)  # finished epochs, in order
    total_epochs: int | None = None
    last_epoch: int | None = None  # the epoch in progress when the output ended (1-based)
    final: dict[str, float] = field(default_factory=dict)  # validation of the best weights after training
    # Per screen line: the epoch being trained when that line was printed (None before training).
    line_epochs: list[int | None] = field(default_factory=list)
    # Epoch -> loss columns first seen non-finite on a progress line.
    nonfinite: dict[int, list[str]] = field(default_factory=dict)


def screen_lines(data: bytes | str) -> list[str]:
    """The lines a terminal would finally show: colours removed, ``\\r`` redraws reduced to the last."""
    if isinstance(data, bytes) and b"\x1b]" not in data:
        return [_last_draw(raw) for raw in data.split(b"\n")]
    # An OSC sequence (a title, a link) may run across line ends: remove escapes from the whole text.
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    text = _ANSI.sub("", text)
    lines = []
    for raw in text.split("\n"):
        draws = [part for part in raw.split("\r") if part.strip()]
        lines.append(draws[-1] if draws else "")
    return lines


def _last_draw(raw: bytes) -> str:
    """The last non-blank ``\\r`` draw of one line, decoded without its escapes.

    Only that draw is decoded: a progress bar redrawn a thousand times costs one decode, not a
    thousand. It is what decoding the whole output first would give: ``\\r`` and ``\\n`` are never
    part of a UTF-8 sequence or of a CSI or two-byte escape.
    """
    if b"\r" not in raw and b"\x1b" not in raw:  # most lines: one draw, no escapes
        text = raw.decode("utf-8", "replace") if raw.strip() else ""
        return text if text.strip() else ""  # str.strip also drops NEL, NBSP ...
    end = len(raw)
    while True:
        start = raw.rfind(b"\r", 0, end) + 1
        part = raw[start:end]
        if part.strip():  # blank in ASCII means blank: skip without decoding
            text = part.decode("utf-8", "replace")
            if "\x1b" in text:
                text = _ANSI.sub("", text)
            if text.strip():
                return text
        if start == 0:
            return ""
        end = start - 1


def screen_line(raw: bytes) -> str:
    """One line of ``screen_lines`` from its raw bytes (split at ``\\n``; no OSC escape in the output)."""
    return _last_draw(raw)


def parse_log(data: bytes | str) -> ParsedLog:
    return parse_lines(screen_lines(data))


def _number(token: str) -> float | None:
    try:
        return float(token.rstrip("G"))
    except ValueError:
        return None


def _may_be_val_header(desc: str) -> bool:
    """Whether ``desc`` starts as a validation header does (``classes`` or ``Class Images``)."""
    first = desc.split(None, 2)
    return bool(first) and (first[0] == "classes" or (len(first) > 2 and first[:2] == ["Class", "Images"]))


def _val_keys(tokens: list[str], fmt: str | None) -> list[str] | None:
    """Result keys named by a validation header, in column order; None if it is not one."""
    if tokens and tokens[0] == "classes":
        keys = [_CLASSIFY_VAL.get(t, f"metrics/{t}") for t in tokens[1:]]
        return keys or None
    if len(tokens) < 3 or tokens[0] != "Class" or tokens[1] != "Images":
        return None
    names = _YOLOV5_VAL if fmt == YOLOV5 else _ULTRALYTICS_VAL
    keys, group = [], None
    for token in tokens[2:]:
        if token.lower() in _COUNT_COLUMNS:
            continue
        name = token
        if "(" in token:
            group, name = token.split("(", 1)
        closes = name.endswith(")")
        name = name.rstrip(")")
        base = names.get(name, name)
        suffix = _GROUP_SUFFIX.get(group.lower(), group[:1]) if group else None
        keys.append(f"metrics/{base}({suffix})" if suffix else f"metrics/{base}")
        if closes:
            group = None
    return keys or None


class _Parser:
    def __init__(self) -> None:
        self.out = ParsedLog()
        self.columns: list[str] | None = None  # the current train header
        self.rows: dict[int, dict[str, float]] = {}
        self.done: set[int] = set()
        self.current: int | None = None
        self.val_keys: list[str] | None = None
        self.after_training = False

    def line(self, line: str) -> None:
        # The first words decide what a line is; a long line (a config or tensor dump) is only
        # split whole when they say it is a table row. Each regex runs only on lines holding a
        # text every one of its matches holds.
        first = line.split(None, 2)
        if not first:
            return
        word = first[0]
        if (
            not word[0].isdigit()  # a progress row starts with "12/100"
            and word not in _FIRST_WORDS
            and not word.startswith(("Class", "classes"))  # a validation header, maybe with ":"
            and " completed in" not in line
            and "recovering from last.pt" not in line
        ):
            return  # most lines (a trainer's step lines, log lines): none of the below applies
        if first[0] == "Epoch" and len(first) > 2 and first[1].lower() == "gpu_mem":
            tokens = line.split()
            self.columns = tokens
            if self.out.format is None:
                v5 = tokens[1] == "gpu_mem" or any(t in ("obj_loss", "obj") for t in tokens)
                self.out.format = YOLOV5 if v5 else ULTRALYTICS
            return
        head = _PERCENT.match(line) if "%" in line else None
        desc = head.group(1) if head else line
        if self.columns and _PROGRESS.match(line):
            self._progress(desc.split())
            return
        keys = _val_keys(desc.split(), self.out.format) if _may_be_val_header(desc) else None
        if keys is not None:
            self.val_keys = keys
        elif first[0] == "all" and self.val_keys:
            self._val_result(line.split()[1:])
        elif " completed in" in line and _COMPLETED.search(line):
            self._finish_training()
        elif "recovering from last.pt" in line and self.current is not None:
            self.rows.pop(self.current, None)  # Ultralytics discards a NaN epoch and trains it again

    def _progress(self, tokens: list[str]) -> None:
        assert self.columns is not None
        if len(tokens) != len(self.columns):
            return  # wrapped or cut line
        shown, total = (int(x) for x in tokens[0].split("/"))
        v5 = self.out.format == YOLOV5
        epoch, total = (shown + 1, total + 1) if v5 else (shown, total)
        if self.after_training:  # a second training in the same output: report the last one
            self.rows, self.done, self.out.final, self.out.nonfinite = {}, set(), {}, {}
            self.after_training = False
        if self.current is not None and epoch > self.current:
            self.done.add(self.current)
        self.current, self.out.total_epochs = epoch, total
        row = self.rows.setdefault(epoch, {})
        for name, token in zip(self.columns[1:], tokens[1:], strict=True):
            value = _number(token)
            lower = name.lower()
            if value is None or lower in _COUNT_COLUMNS:
                continue
            if lower == "gpu_mem":
                row["gpu_mem_gb"] = value
                continue
            key = "train/" + (_V6_LOSSES.get(lower, name) if v5 else name)
            row[key] = value
            bad = self.out.nonfinite.setdefault(epoch, []) if not math.isfinite(value) else None
            if bad is not None and key not in bad:
                bad.append(key)

    def _val_result(self, tokens: list[str]) -> None:
        assert self.val_keys is not None
        values = [_number(t) for t in tokens]
        if len(values) < len(self.val_keys) or any(v is None for v in values[-len(self.val_keys) :]):
            return
        result = dict(zip(self.val_keys, values[-len(self.val_keys) :], strict=True))
        self.val_keys = None
        if self.after_training:
            self.out.final = result  # type: ignore[assignment]
        elif self.current is not None:
            self.rows.setdefault(self.current, {}).update(result)  # type: ignore[arg-type]

    def _finish_training(self) -> None:
        if self.current is not None:
            self.done.add(self.current)
        self.after_training = True

    def result(self) -> ParsedLog:
        self.out.epochs = [ParsedEpoch(e, self.rows[e]) for e in sorted(self.done) if e in self.rows]
        self.out.last_epoch = self.current
        return self.out


def parse_lines(lines: list[str]) -> ParsedLog:
    """Parse screen lines (see ``screen_lines``)."""
    parser = _Parser()
    for line in lines:
        parser.line(line)
        parser.out.line_epochs.append(parser.current)
    return parser.result()


def parse_numbered(lines: list[tuple[int, str]], count: int) -> ParsedLog:
    """``parse_lines`` of ``count`` screen lines of which only ``lines`` (index, text; in order)
    may change the parser's state: every other line is one the parser passes over (what
    core/training/candidates.py finds), so it only repeats the epoch in ``line_epochs``."""
    parser = _Parser()
    epochs = parser.out.line_epochs
    done = 0
    for index, line in lines:
        epochs.extend([parser.current] * (index - done))
        parser.line(line)
        epochs.append(parser.current)
        done = index + 1
    epochs.extend([parser.current] * (count - done))
    return parser.result()


class LineParser:
    """``parse_lines`` one screen line at a time, for output still being written (a followed
    container log). ``line`` returns the epochs that line showed finished; ``result`` is a fresh
    ``ParsedLog`` at any point (without ``line_epochs``, which would grow with the output)."""

    def __init__(self) -> None:
        self._parser = _Parser()

    def line(self, line: str) -> list[int]:
        before, done = self._parser.current, len(self._parser.done)
        self._parser.line(line)
        return [before] if before is not None and len(self._parser.done) > done else []

    def result(self) -> ParsedLog:
        out = self._parser.result()
        return ParsedLog(
            format=out.format,
            epochs=[ParsedEpoch(e.epoch, dict(e.metrics)) for e in out.epochs],
            total_epochs=out.total_epochs,
            last_epoch=out.last_epoch,
            final=dict(out.final),
            nonfinite={k: list(v) for k, v in out.nonfinite.items()},
        )
