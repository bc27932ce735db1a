"""Why a training failed, read from its console output and exit status (no dmesg, no root).

``explain`` returns structured failures (kind, epoch, one-line message) and the one-line reason
for the run's status. Kinds (they become run events of the same name):

- ``cuda_oom``: CUDA out of memory. Ultralytics' own recovery in the first epoch (halve the batch,
  retry) is recorded with ``recovered=True`` and is not a reason for failure.
- ``nan_loss``: a loss printed as ``nan``/``inf``, or Ultralytics' NaN/Inf detection.
- ``dataset_not_found``: the data.yaml or its image folders are missing.
- ``oom_killed``: killed by the kernel's OOM killer, inferred without dmesg: a data-loader worker
  "killed by signal: Killed", a shell's ``Killed`` job report, or CMD ending by SIGKILL while its
  peak RSS was within 10 % of the memory limit.

Epochs are 1-based, the epoch being trained when the failure was printed (None before training).
"""

from __future__ import annotations

import re
import signal as signals
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuledger.core.training import failure_words
from gpuledger.core.training.candidates import MIN_B, candidate_lines, whole
from gpuledger.core.training.logparse import ParsedLog, parse_lines, parse_numbered, screen_line, screen_lines

if TYPE_CHECKING:
    import mmap

CUDA_OOM = "cuda_oom"
NAN_LOSS = "nan_loss"
DATASET_NOT_FOUND = "dataset_not_found"
OOM_KILLED = "oom_killed"
KINDS = (CUDA_OOM, NAN_LOSS, DATASET_NOT_FOUND, OOM_KILLED)

NEAR_LIMIT = 0.9  # peak RSS at or above this share of the memory limit counts as "at the limit"

_OOM = re.compile(r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED")
_OOM_RETRY = re.compile(r"out of memory with batch=(\d+)\. Reducing to batch=(\d+)")
_OOM_DETAIL = re.compile(r"Tried to allocate ([\d.]+ [KMGT]i?B)")
_OOM_GPU = re.compile(r"GPU (\d+)")
_NAN = re.compile(r"(?:Loss|Fitness) NaN/Inf detected|NaN persisted|non-finite loss|Loss is nan|loss is NaN", re.I)
_DATASET = re.compile(r"Dataset\b.*\b(?:not found|error)|Dataset '[^']*' images not found", re.I)
_WORKER_KILLED = re.compile(r"DataLoader worker \(pid[^)]*\) is killed by signal: Killed")
_SHELL_KILLED = re.compile(r"(?:^|:\s|\s\d+\s+)Killed(?:\s|$)")
# Applied only to a line one of the patterns above matched: they need none of the words below.
DETAIL_PATTERNS = (_OOM_RETRY, _OOM_DETAIL, _OOM_GPU)
# Words every match of the patterns above holds (failure_words.py): a line with none of them is not
# searched (on long lines the patterns cost far more than finding these words in the whole log, and
# most lines of training output hold none). _NAN and _DATASET ignore case: their words are found
# lower-cased.
_WORDS = failure_words.WORDS
_WORDS_ANY_CASE = failure_words.WORDS_ANY_CASE
_CASE_SPECIALS = failure_words.CASE_SPECIALS


def _lines_to_search(lines: list[str]) -> Sequence[int]:
    """The indices, in order, of the lines that may match one of the failure patterns. The words
    are looked for in the log's UTF-8 bytes (ASCII words, so lower-casing the bytes is what
    IGNORECASE does with them), and a hit's line is the number of line ends before it."""
    joined = "\n".join(lines)
    if any(c in joined for c in _CASE_SPECIALS):
        return range(len(lines))
    text = joined.encode("utf-8", "surrogatepass")
    found: set[int] = set()
    for haystack, words in ((text, _WORDS), (text.lower(), _WORDS_ANY_CASE)):
        for word in words:
            line = counted = 0
            at = haystack.find(word)
            while at >= 0:
                line += haystack.count(b"\n", counted, at)
                counted = at
                found.add(line)
                end = haystack.find(b"\n", at)
                at = haystack.find(word, end + 1) if end >= 0 else -1  # on from the next line
    return sorted(found)


def _read(log: bytes | mmap.mmap | str, fast_min_b: int = MIN_B) -> tuple[ParsedLog, list[tuple[int, str]]]:
    """The parsed training output, and the screen lines (index, text) the failure patterns must
    search. Only the lines that may matter are decoded when core/training/candidates.py can
    find them (the same result: tests/test_relay_parse.py), else every line."""
    found = candidate_lines(log, fast_min_b) if not isinstance(log, str) else None
    if found is None:
        lines = screen_lines(log if isinstance(log, str) else whole(log))
        return parse_lines(lines), [(i, lines[i]) for i in _lines_to_search(lines)]
    raw, count = found
    numbered = [(i, screen_line(line)) for i, line in raw]
    return parse_numbered(numbered, count), [numbered[k] for k in _lines_to_search([t for _, t in numbered])]


@dataclass
class Failure:
    kind: str
    message: str  # one line
    epoch: int | None = None
    line: int | None = None  # index into the screen lines, for the curious
    fatal: bool = True
    payload: dict[str, Any] = field(default_factory=dict)

    def event_payload(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "fatal": self.fatal, **self.payload}


@dataclass
class Diagnosis:
    failures: list[Failure]
    reason: str | None  # for the run's status line; None when nothing explains a failure
    parsed: ParsedLog = field(default_factory=ParsedLog)  # the training output read on the way


def _at(epoch: int | None, total: int | None) -> str:
    if epoch is None:
        return "before training started"
    return f"at epoch {epoch}/{total}" if total else f"at epoch {epoch}"


def _gib(value: int) -> str:
    return f"{value / 2**30:.1f} GiB"


def killed_by_sigkill(exit_code: int | None, signal: int | None) -> bool:
    """SIGKILL ended the command (or a shell in between said so with 137): the one end for which
    ``explain`` weighs the peak memory (the OOM killer)."""
    return signal == signals.SIGKILL or (signal is None and exit_code == 128 + signals.SIGKILL)


def explain(
    log: bytes | mmap.mmap | str | None,
    status: str = "failed",
    exit_code: int | None = None,
    signal: int | None = None,
    rss_peak_b: int | None = None,
    mem_limit_b: int | None = None,
) -> Diagnosis:
    """Failures found in ``log`` and the exit status; ``status`` is the run's (succeeded, failed ...)."""
    parsed, searched = _read(log or b"")
    total = parsed.total_epochs
    found: list[Failure] = []
    seen: set[str] = set()

    def add(failure: Failure) -> None:
        # One event per kind, except recovered CUDA OOMs which are each worth knowing about.
        key = failure.kind + ("/recovered" if not failure.fatal else "")
        if failure.kind == CUDA_OOM and not failure.fatal:
            key += str(failure.line)
        if key not in seen:
            seen.add(key)
            found.append(failure)

    for i, line in searched:
        epoch = parsed.line_epochs[i] if i < len(parsed.line_epochs) else None
        text = line.strip()
        if _OOM.search(text):
            retry = _OOM_RETRY.search(text)
            payload: dict[str, Any] = {}
            detail = _OOM_DETAIL.search(text)
            if detail:
                payload["tried_to_allocate"] = detail.group(1)
            gpu = _OOM_GPU.search(text)
            if gpu:
                payload["gpu"] = int(gpu.group(1))
            if retry:
                payload.update(batch=int(retry.group(1)), retry_batch=int(retry.group(2)))
                msg = (
                    f"CUDA out of memory {_at(epoch, total)} with batch={retry.group(1)}; "
                    f"retried with batch={retry.group(2)}"
                )
                add(Failure(CUDA_OOM, msg, epoch, i, fatal=False, payload=payload))
            else:
                extra = f" (tried to allocate {payload['tried_to_allocate']})" if "tried_to_allocate" in payload else ""
                add(Failure(CUDA_OOM, f"CUDA out of memory {_at(epoch, total)}{extra}", epoch, i, payload=payload))
        elif _NAN.search(text):
            first = next((f for f in found if f.kind == NAN_LOSS), None)
            if first is None:
                add(Failure(NAN_LOSS, f"loss became NaN/Inf {_at(epoch, total)}: {text[:160]}", epoch, i))
            else:  # keep where it started, say how it ended ("NaN persisted for 4 epochs")
                first.message = f"loss became NaN/Inf {_at(first.epoch, total)}: {text[:160]}"
        elif _DATASET.search(text):
            # The error line comes last (after warnings): keep the latest as the message.
            found[:] = [f for f in found if f.kind != DATASET_NOT_FOUND]
            seen.discard(DATASET_NOT_FOUND)
            add(Failure(DATASET_NOT_FOUND, f"dataset not found: {text[:200]}", epoch, i))
        elif _WORKER_KILLED.search(text):
            msg = f"a data-loader worker was killed (SIGKILL, usually the OOM killer) {_at(epoch, total)}"
            add(Failure(OOM_KILLED, msg, epoch, i, payload={"evidence": "dataloader_worker_killed"}))
        elif _SHELL_KILLED.search(text):
            msg = f"killed by SIGKILL, most likely the OOM killer, {_at(epoch, total)}"
            add(Failure(OOM_KILLED, msg, epoch, i, payload={"evidence": "killed_in_log"}))

    for epoch, keys in parsed.nonfinite.items():
        if NAN_LOSS not in seen:
            add(
                Failure(
                    NAN_LOSS,
                    f"loss became NaN/Inf at epoch {epoch} ({', '.join(keys)})",
                    epoch,
                    None,
                    payload={"keys": keys},
                )
            )

    sigkill = killed_by_sigkill(exit_code, signal)
    near_limit = bool(rss_peak_b and mem_limit_b and rss_peak_b >= NEAR_LIMIT * mem_limit_b)
    if sigkill and near_limit and OOM_KILLED not in seen:
        assert rss_peak_b is not None and mem_limit_b is not None
        msg = (
            f"killed by SIGKILL with peak RSS {_gib(rss_peak_b)} of a {_gib(mem_limit_b)} limit "
            f"(the OOM killer) {_at(parsed.last_epoch, total)}"
        )
        add(
            Failure(
                OOM_KILLED,
                msg,
                parsed.last_epoch,
                None,
                payload={"evidence": "sigkill_at_memory_limit", "rss_peak_b": rss_peak_b, "mem_limit_b": mem_limit_b},
            )
        )
    return Diagnosis(found, _reason(found, status), parsed)


# Which failure explains the end best: a missing dataset stops everything before anything else.
_PRIORITY = (DATASET_NOT_FOUND, CUDA_OOM, OOM_KILLED, NAN_LOSS)


def _reason(found: list[Failure], status: str) -> str | None:
    if status == "succeeded":
        return None
    fatal = [f for f in found if f.fatal]
    for kind in _PRIORITY:
        for failure in fatal:
            if failure.kind == kind:
                return failure.message
    return None
