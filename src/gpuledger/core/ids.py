"""Run ids: UUIDv7 (RFC 9562), so ids sort by creation time; and the short id people type.

A UUIDv7 starts with a 48-bit millisecond timestamp, so runs of the same hours share their first
eight hex digits and a prefix needs about eleven characters to be unique. The short id is made
from the other end, the random tail: its last 40 bits (the last ten hex digits) in lower-case
Crockford base32, eight characters such as ``k3m9x2qa``. Forty random bits make two runs of a
ledger with 100,000 runs share a short id with a chance of about 0.5 %; a clash is not an error
anyway, only an "ambiguous" answer that lists both runs.
"""

from __future__ import annotations

import os
import re
import uuid

CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"
SHORT_LEN = 8
TAIL_HEX = 10  # 40 bits: what the short id encodes
_DECODE = {c: i for i, c in enumerate(CROCKFORD)} | {"i": 1, "l": 1, "o": 0}  # Crockford's read-alikes
_HEX_TAIL = re.compile(r"[0-9a-f]{10}$")


def uuid7(unix_ms: int, rand: bytes | None = None) -> str:
    """A UUIDv7 string from a millisecond timestamp (passed in: core reads no clock)."""
    rand = rand if rand is not None else os.urandom(10)
    value = (unix_ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= (int.from_bytes(rand[:2], "big") & 0x0FFF) << 64  # rand_a
    value |= 0b10 << 62  # variant
    value |= int.from_bytes(rand[2:10], "big") & ((1 << 62) - 1)  # rand_b
    return str(uuid.UUID(int=value))


def uuid7_time_ms(run_id: str) -> int:
    return uuid.UUID(run_id).int >> 80


def short_id(run_id: str) -> str:
    """The eight-character short id of a run id; an id that does not end in ten hex digits (not a
    UUID) is its own short id."""
    tail = run_id.lower()[-TAIL_HEX:]
    if not _HEX_TAIL.match(tail):
        return run_id
    bits = int(tail, 16)
    return "".join(CROCKFORD[(bits >> shift) & 31] for shift in range(35, -1, -5))


def tail_of_short_id(ref: str) -> str | None:
    """The ten hex digits a run id ends with when ``ref`` is a short id (case and Crockford's
    read-alike letters i, l, o forgiven), else None."""
    text = ref.strip().lower()
    if len(text) != SHORT_LEN or any(c not in _DECODE for c in text):
        return None
    bits = 0
    for c in text:
        bits = bits << 5 | _DECODE[c]
    return f"{bits:0{TAIL_HEX}x}"
