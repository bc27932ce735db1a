"""A container's log as ``/containers/{id}/logs?timestamps=1`` streams it, decoded and parsed.

Wire format (Docker Engine API, "Get container logs"; observed on Engine 20.10):

* Without a TTY the stream is multiplexed: frames of an 8-byte header — stream type (0 stdin,
  1 stdout, 2 stderr, 3 the daemon's own error), three zero bytes, the payload length as a
  big-endian uint32 — then the payload. A frame may be split across reads, and one read may
  hold many frames. Each frame is one log message: ``<RFC 3339 nano time> <bytes>``.
* With a TTY (``Config.Tty``) the stream is raw: the messages are simply concatenated.
* Which of the two a response is, the daemon says in its ``Content-Type`` from API 1.42 on:
  ``application/vnd.docker.multiplexed-stream`` or ``application/vnd.docker.raw-stream``. Asked at
  an older version it says ``raw-stream`` for both (moby ``getContainersLogs``), and Engine 20.10
  sends no ``Content-Type`` at all: only then is the container's TTY flag what decides
  (``decoder_for``).
* A message is a line the program wrote, ending in ``\\n`` — or, for a line longer than the log
  driver's buffer (16 KiB for json-file), a *partial* message without ``\\n``, each with its own
  timestamp. A tqdm bar redrawn with ``\\r`` and no ``\\n`` for a whole epoch is such a line, so
  in the raw stream a timestamp can appear in the middle of a line: it is removed here.

What comes out (``ContainerLog``) is what ``gpuledger run`` keeps for a wrapped run: the
program's bytes, redacted by ``core/redaction/redact.py`` before anything is stored, written to an optional
file, and parsed line by line by ``core/training/logparse.py`` into YOLO epochs and metrics (``\\r``
redraws reduced to the last, as a terminal shows them). Lines are capped, so binary garbage or a
100 MB line without a newline costs bounded memory. The file is kept as the ledger will store the
log (node/log_spool.py: head and tail under ``GPULEDGER_LOG_MAX_B``), so ``capped()`` is the log to
archive whatever its length; the lines also say where the training writes its results
(node/yolo_console.py).
"""

from __future__ import annotations

import copy
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuledger.core.redaction.redact import LineRedactor, Redactor
from gpuledger.core.training.logcap import DEFAULT_MAX_B, CappedLog
from gpuledger.core.training.logparse import LineParser, ParsedLog, screen_lines
from gpuledger.node.docker_inspect import docker_time_ns
from gpuledger.node.eval_console import EvalSpan
from gpuledger.node.log_spool import HeadTailSpool
from gpuledger.node.yolo_console import TrainingFacts

STDOUT, STDERR, SYSTEMERR = 1, 2, 3
MAX_LINE_BYTES = 64 * 1024  # longer screen lines are cut: no training prints such a line

# A message's leading timestamp. Docker writes RFC3339NanoFixed; other fractions are accepted.
_LEADING_TS = re.compile(rb"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)) ")
# A partial message's timestamp inside a raw (TTY) line: only Docker's exact fixed form.
_INNER_TS = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z ")
_TS_CHARS = re.compile(rb"[0-9T:.Z+\-]*")
_TS_MAX = 36  # "2006-01-02T15:04:05.999999999+07:00 "


@dataclass(frozen=True)
class Message:
    """A piece of one stream: ``stream`` 1 stdout / 2 stderr; ``t_ns`` when the daemon logged it."""

    stream: int
    t_ns: int | None
    data: bytes


def _split_timestamp(payload: bytes) -> tuple[int | None, bytes]:
    m = _LEADING_TS.match(payload)
    if m is None:
        return None, payload
    return docker_time_ns(m.group(1)), payload[m.end() :]


class FrameDecoder:
    """The multiplexed stream. A header that cannot be one (a stream type above 3, non-zero
    padding) means the stream is raw after all: the rest is handed to a ``RawDecoder``."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._raw: RawDecoder | None = None

    @property
    def fell_back_to_raw(self) -> bool:
        return self._raw is not None

    def feed(self, data: bytes) -> list[Message]:
        if self._raw is not None:
            return self._raw.feed(data)
        self._buf += data
        out: list[Message] = []
        while len(self._buf) >= 8:
            kind, pad, size = self._buf[0], bytes(self._buf[1:4]), int.from_bytes(self._buf[4:8], "big")
            if kind > SYSTEMERR or pad != b"\0\0\0":
                self._raw = RawDecoder()
                rest, self._buf = bytes(self._buf), bytearray()
                return out + self._raw.feed(rest)
            if len(self._buf) < 8 + size:
                break
            payload = bytes(self._buf[8 : 8 + size])
            del self._buf[: 8 + size]
            t_ns, body = _split_timestamp(payload)
            out.append(Message(kind, t_ns, body))
        return out


MULTIPLEXED_STREAM = "application/vnd.docker.multiplexed-stream"
RAW_STREAM = "application/vnd.docker.raw-stream"
_TRUSTED_CONTENT_TYPE = (1, 42)  # below it the daemon calls every log stream raw


def decoder_for(content_type: str | None, api_version: tuple[int, int] | None, tty: bool) -> FrameDecoder | RawDecoder:
    """The decoder for a log response: its ``Content-Type`` when the API version asked at makes it
    true, else the container's ``Config.Tty`` (an old daemon, or a proxy that dropped the header)."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if api_version is not None and api_version >= _TRUSTED_CONTENT_TYPE:
        if media == MULTIPLEXED_STREAM:
            return FrameDecoder()
        if media == RAW_STREAM:
            return RawDecoder()
    return RawDecoder() if tty else FrameDecoder()


class RawDecoder:
    """The TTY stream: messages concatenated, each ``<time> <bytes>``, ending in ``\\n`` unless partial."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._at_start = True
        self._t_ns: int | None = None

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out: list[Message] = []
        while self._buf:
            if self._at_start:
                m = _LEADING_TS.match(self._buf)
                if m is None and len(self._buf) < _TS_MAX and _TS_CHARS.fullmatch(self._buf):
                    break  # the timestamp is still arriving
                if m is not None:
                    self._t_ns = docker_time_ns(m.group(1))
                    del self._buf[: m.end()]
                self._at_start = False
            end = self._buf.find(b"\n")
            if end >= 0:
                line = bytes(self._buf[: end + 1])
                del self._buf[: end + 1]
                self._at_start = True
                out.append(Message(STDOUT, self._t_ns, _INNER_TS.sub(b"", line)))
                continue
            cut = self._safe_cut()
            if cut > 0:
                out.append(Message(STDOUT, self._t_ns, _INNER_TS.sub(b"", bytes(self._buf[:cut]))))
                del self._buf[:cut]
            break
        return out

    def _safe_cut(self) -> int:
        """How much of an unfinished line can go now: all but a tail that may be a timestamp's start."""
        cut = len(self._buf) - _TS_MAX
        for m in _INNER_TS.finditer(self._buf, max(0, cut - _TS_MAX)):
            if m.start() < cut < m.end():
                cut = m.start()
        return max(cut, 0)


class ScreenLines:
    """Bytes of one stream → the lines a terminal would finally show, one at a time.

    A line still being drawn is kept reduced: once it passes ``max_bytes`` only its last finished
    ``\\r`` redraw that shows something (what a terminal shows) and the redraw in progress are
    kept; a redraw longer than that is cut to the cap (``cut_lines`` counts the cuts).
    """

    def __init__(self, max_bytes: int = MAX_LINE_BYTES) -> None:
        self._max = max_bytes
        self._buf = bytearray()
        self._cutting = False
        self.cut_lines = 0

    def feed(self, data: bytes) -> list[str]:
        out: list[str] = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                self._append(data[start:])
                return out
            self._append(data[start:end])
            out.append(self._take())
            start = end + 1

    def flush(self) -> list[str]:
        return [self._take()] if self._buf else []

    def _take(self) -> str:
        line = screen_lines(bytes(self._buf))[0]
        self._buf.clear()
        self._cutting = False
        return line

    def _append(self, data: bytes) -> None:
        if self._cutting:  # dropping the rest of an over-long redraw, up to its next \r
            cr = data.find(b"\r")
            if cr < 0:
                return
            data, self._cutting = data[cr:], False
        self._buf += data
        if len(self._buf) <= self._max:
            return
        last_cr = self._buf.rfind(b"\r")
        if last_cr > 0:  # finished redraws: only the last one showing something matters
            self._buf[:last_cr] = screen_lines(bytes(self._buf[:last_cr]))[0].encode()[: self._max // 2]
        if len(self._buf) > self._max:  # the redraw in progress alone is too long
            del self._buf[self._max :]
            self._cutting = True
            self.cut_lines += 1


@dataclass
class LogView:
    """What a followed log has shown so far (a snapshot; the follower keeps going)."""

    container_id: str
    parsed: ParsedLog
    epoch_times: dict[int, float] = field(default_factory=dict)  # epoch -> when the log showed it finished
    lines: int = 0
    bytes: int = 0
    cut_lines: int = 0  # lines longer than the cap, cut
    path: Path | None = None  # the redacted copy, when kept (head and tail once past the cap)
    file_cut: bool = False  # the copy holds only the log's head and tail (it passed the cap)
    training: TrainingFacts = field(default_factory=TrainingFacts)  # run directory, training start
    evaluation: EvalSpan = field(default_factory=EvalSpan)  # when an evaluation printed (node/eval_console.py)
    done: bool = False  # the container stopped and its log was read to the end
    error: str | None = None  # why the log could not be read (a proxy refusing it, a driver without reads)


class ContainerLog:
    """One container's log: fed ``Message`` s by its follower, read by the agent through ``view()``."""

    def __init__(
        self,
        container_id: str,
        *,
        redactor: Redactor | None = None,
        path: Path | None = None,
        max_line_bytes: int = MAX_LINE_BYTES,
        cap_b: int = DEFAULT_MAX_B,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.container_id = container_id
        self._redactor = redactor or Redactor.default()
        self._streams: dict[int, tuple[LineRedactor, ScreenLines]] = {}
        self._max_line = max_line_bytes
        self._parser = LineParser()
        self._lock = threading.Lock()
        self._wall = wall
        self._spool = HeadTailSpool(path, cap_b) if path is not None else None
        self._training = TrainingFacts()
        self._evaluation = EvalSpan()
        self._view = LogView(container_id, ParsedLog(), path=path)
        self.last_t_ns: int | None = None  # the newest message's time: where a new follow resumes
        self._bytes_at_last = 0  # bytes read with that time (the pieces of one long line share it)
        self._skip_t: int | None = None  # after a resume: what the daemon sends again, to skip
        self._skip_bytes = 0
        self._copy_failed = False  # the copy could not be written: parsing goes on without it

    # -- fed by the follower ------------------------------------------------------------------------
    def resume(self) -> str | None:
        """``since`` for a new follow. The daemon sends again everything logged at or after that
        time ("since" is inclusive): the messages before it, and the bytes already read of those
        at it (a long line's pieces, read before the stream broke), are skipped."""
        with self._lock:
            self._skip_t, self._skip_bytes = self.last_t_ns, self._bytes_at_last
            self._view.done = False
            t = self.last_t_ns
        return None if t is None else f"{t // 1_000_000_000}.{t % 1_000_000_000:09d}"

    def add(self, messages: list[Message]) -> None:
        with self._lock:
            for msg in messages:
                self._add(msg)

    def _add(self, msg: Message) -> None:
        data, t = msg.data, msg.t_ns
        if t is not None:
            if self._skip_t is not None and t <= self._skip_t:
                if t < self._skip_t:
                    return
                seen = min(self._skip_bytes, len(data))
                self._skip_bytes -= seen
                data = data[seen:]
                if not data:
                    return
            self._skip_t = None
            if self.last_t_ns is None or t > self.last_t_ns:
                self.last_t_ns, self._bytes_at_last = t, 0
            if t == self.last_t_ns:
                self._bytes_at_last += len(data)
        if msg.stream == SYSTEMERR:
            self._view.error = "the daemon reported: " + data.decode("utf-8", "replace").strip()[:300]
            return
        self._view.bytes += len(data)
        redactor, screen = self._stream(msg.stream)
        clean = redactor.feed(data)
        self._keep(clean)
        self._parse(screen.feed(clean), t)

    def _stream(self, stream: int) -> tuple[LineRedactor, ScreenLines]:
        if stream not in self._streams:
            self._streams[stream] = (LineRedactor(self._redactor, 4 * self._max_line), ScreenLines(self._max_line))
        return self._streams[stream]

    def _parse(self, lines: list[str], t_ns: int | None) -> None:
        when = t_ns / 1e9 if t_ns is not None else self._wall()
        for line in lines:
            self._view.lines += 1
            self._training.feed(line, when)
            self._evaluation.feed(line, when)
            for epoch in self._parser.line(line):
                self._view.epoch_times.setdefault(epoch, when)

    def _keep(self, data: bytes) -> None:
        if not data or self._spool is None or self._copy_failed:
            return
        try:
            self._spool.append(data)
        except OSError as exc:  # the log is still parsed; its copy is not kept
            self._copy_failed = True
            self._view.error = f"cannot write {self._spool.path}: {exc.strerror or exc}"
        self._view.file_cut = self._spool.total_b > self._spool.cap_b

    def finish(self, error: str | None = None) -> None:
        """The log ended (the container stopped) or cannot be read (``error``)."""
        with self._lock:
            for redactor, screen in self._streams.values():
                tail = redactor.flush()
                self._keep(tail)
                self._parse(screen.feed(tail) + screen.flush(), self.last_t_ns)
            self._view.done = error is None
            if error is not None:
                self._view.error = error
            if self._spool is not None:
                self._spool.close()

    # -- read by the agent ----------------------------------------------------------------------------
    @property
    def error(self) -> str | None:
        with self._lock:
            return self._view.error

    def settled(self) -> bool:
        """The log was read to its end (the container stopped), or cannot be read."""
        with self._lock:
            return self._view.done or self._view.error is not None

    def view(self) -> LogView:
        with self._lock:
            out = copy.copy(self._view)
            out.parsed = self._parser.result()
            out.epoch_times = dict(self._view.epoch_times)
            out.cut_lines = sum(screen.cut_lines for _, screen in self._streams.values())
            out.training = copy.copy(self._training)
            out.evaluation = copy.copy(self._evaluation)
            return out

    def capped(self) -> CappedLog | None:
        """The redacted log so far as the ledger stores it (head and tail around the cut marker once
        it passes the cap); None when no copy is kept, nothing was logged or it cannot be read."""
        with self._lock:
            if self._spool is None or self._copy_failed:
                return None
            return self._spool.capped()

    def discard(self) -> None:
        """Remove the copy (the container is forgotten)."""
        with self._lock:
            if self._spool is not None:
                self._spool.remove()
