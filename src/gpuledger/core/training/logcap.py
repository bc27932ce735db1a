"""The cap on a stored run log: keep its head and its tail, and say in between what was cut.

A chatty training can print gigabytes; the ledger keeps at most ``cap`` bytes of it. What is kept
is the first eighth of the cap (the command line, the configuration, the first epochs) and the
rest from the end (the last epochs and the error that ended the run). Between them one marker line
says how many bytes were cut and where (here on two lines)::

    [gpuledger: 12345678 bytes cut here; the first 8388608 and the last 58720126 of 79453912 bytes
    are kept (cap 67108864 bytes, GPULEDGER_LOG_MAX_B)]

The cuts fall on line ends when one is near, so no line (and no UTF-8 character) is split. The
stored bytes, marker included, are never more than the cap; their sha256 is what the ledger and
the audit trail record. ``find_cut`` reads the marker back, checking that its numbers match where
it sits, so a command that prints a look-alike line is not taken for a cut log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ENV_VAR = "GPULEDGER_LOG_MAX_B"
DEFAULT_MAX_B = 64 * 1024 * 1024
MIN_MAX_B = 64 * 1024  # room for a useful head and tail around the marker
HEAD_SHARE = 8  # the head is 1/8 of the cap, the tail the rest
LINE_SLACK_B = 64 * 1024  # a cut moves to a line end at most this far
_MARKER_ROOM_B = 256  # the marker is shorter than this whatever its numbers

_MARKER = re.compile(
    rb"\[gpuledger: (\d+) bytes cut here; the first (\d+) and the last (\d+) of (\d+) bytes are kept"
    rb" \(cap (\d+) bytes, " + ENV_VAR.encode() + rb"\)\]\n"
)
_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "k": 1024, "m": 1024**2, "g": 1024**3}
_SIZE = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*")


@dataclass(frozen=True)
class CappedLog:
    data: bytes  # what is stored: the whole log, or head + marker + tail
    total_b: int  # the whole log's size
    truncated: bool


@dataclass(frozen=True)
class Cut:
    """Where a stored log was cut: its first ``head_b`` and last ``tail_b`` bytes are the log's."""

    cut_b: int
    head_b: int
    tail_b: int
    total_b: int
    cap_b: int


def parse_size(text: str) -> int:
    """Bytes from "67108864", "64MiB", "64 MiB", "512KiB", "1GiB" (or K/M/G, meaning KiB/MiB/GiB)."""
    m = _SIZE.fullmatch(text)
    factor = _UNITS.get(m.group(2).lower()) if m else None
    if m is None or factor is None:
        raise ValueError(f"{text!r} is not a size (bytes, or a number with KiB, MiB or GiB)")
    return int(m.group(1)) * factor


def check_cap(cap_b: int) -> int:
    if cap_b < MIN_MAX_B:
        raise ValueError(f"a log cap of {cap_b} bytes is too small (at least {MIN_MAX_B} bytes, 64 KiB)")
    return cap_b


def windows(total_b: int, cap_b: int) -> tuple[int, int]:
    """How many bytes of a ``total_b``-byte log to read from its start and from its end so that
    ``cap_parts`` can build the stored copy (both 0 when the whole log fits)."""
    check_cap(cap_b)
    if total_b <= cap_b:
        return 0, 0
    head = cap_b // HEAD_SHARE
    return head, cap_b - head - _MARKER_ROOM_B


def cap_parts(head: bytes, tail: bytes, total_b: int, cap_b: int) -> CappedLog:
    """The stored copy of a ``total_b``-byte log that does not fit ``cap_b``, from its first and
    last bytes (as many as ``windows`` says: more is cut away, less leaves less)."""
    head_b, tail_b = windows(total_b, cap_b)
    head, tail = head[:head_b], tail[max(0, len(tail) - tail_b) :]
    line_end = head.rfind(b"\n", max(0, len(head) - LINE_SLACK_B))
    if line_end >= 0:
        head = head[: line_end + 1]
    line_end = tail.find(b"\n", 0, LINE_SLACK_B)
    if 0 <= line_end < len(tail) - 1:
        tail = tail[line_end + 1 :]
    cut_b = total_b - len(head) - len(tail)
    marker = (
        ("" if not head or head.endswith(b"\n") else "\n")  # the marker is a line of its own
        + f"[gpuledger: {cut_b} bytes cut here; the first {len(head)} and the last {len(tail)} of {total_b} bytes"
        f" are kept (cap {cap_b} bytes, {ENV_VAR})]\n"
    ).encode()
    return CappedLog(head + marker + tail, total_b, True)


def cap_bytes(data: bytes, cap_b: int) -> CappedLog:
    """``data`` as stored under ``cap_b``: whole when it fits, else head + marker + tail."""
    total = len(data)
    head_b, tail_b = windows(total, cap_b)
    if not head_b:
        return CappedLog(bytes(data), total, False)
    return cap_parts(data[:head_b], data[total - tail_b :], total, cap_b)


def find_cut(stored: bytes) -> Cut | None:
    """The cut of a stored log, read from its marker; None when it was stored whole."""
    start = 0
    while (at := stored.find(b"[gpuledger: ", start)) >= 0:
        m = _MARKER.match(stored, at)
        start = at + 1
        if m is None:
            continue
        cut_b, head_b, tail_b, total_b, cap_b = (int(g) for g in m.groups())
        # The marker starts right after the head, on a line of its own (a newline may precede it).
        placed = stored[head_b:at] in (b"", b"\n") and (head_b == 0 or stored[at - 1 : at] == b"\n")
        if placed and tail_b == len(stored) - m.end() and head_b + cut_b + tail_b == total_b:
            return Cut(cut_b, head_b, tail_b, total_b, cap_b)
    return None
