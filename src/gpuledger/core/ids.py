"""Run ids: UUIDv7 (RFC 9562), so ids sort by creation time and prefixes stay short and unique."""

from __future__ import annotations

import os
import uuid


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
