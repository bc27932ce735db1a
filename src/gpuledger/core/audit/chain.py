"""The audit log's hash chain: canonical JSON, row hashes, and checking a chain (pure, no I/O).

Each audit row is ``seq, t, actor, action, object, payload, prev_hash, hash`` with
``hash = sha256(canonical_json({seq, t, actor, action, object, payload}) + prev_hash)`` and
``prev_hash`` the previous row's hash (GENESIS for seq 1). ``payload`` is itself canonical JSON
text, stored as text, so the bytes hashed are the bytes kept. Editing a row breaks its own hash;
removing or inserting one breaks the links after it; only rewriting the whole tail from that point
on escapes detection, which an externally kept head (``seq:hash``) catches.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

GENESIS = "0" * 64
HASHED_FIELDS = ("seq", "t", "actor", "action", "object", "payload")


def _plain(obj: Any) -> Any:
    """JSON-safe: non-finite floats become strings, tuples lists, bytes hex, other objects str."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj).hex()
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return str(obj)


def _default(obj: Any) -> Any:
    """What ``_plain`` makes of a value json cannot write itself."""
    if isinstance(obj, Mapping):
        return {str(k): v for k, v in obj.items()}
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj).hex()
    return str(obj)


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                            default=_default)  # fmt: skip
_PLAIN_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(obj: Any) -> str:
    """One text per value: sorted keys, no spaces, UTF-8 kept, floats as Python's shortest repr."""
    try:  # the common case in one C call; the same text as through _plain (verify reads ~10^7 values)
        return _ENCODER.encode(obj)
    except (ValueError, TypeError):  # a NaN or infinity, or keys of mixed types: spelled out by _plain
        return _PLAIN_ENCODER.encode(_plain(obj))


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def row_hash(row: Mapping[str, Any], prev_hash: str) -> str:
    """The hash of an audit row (its HASHED_FIELDS) chained to ``prev_hash``."""
    body = canonical_json({k: row[k] for k in HASHED_FIELDS})
    return sha256_hex(body + prev_hash)


@dataclass(frozen=True)
class ChainProblem:
    seq: int
    kind: str  # "edited", "missing", "relinked", "out_of_order"
    message: str


def check_chain(rows: Iterable[Mapping[str, Any]]) -> Iterator[ChainProblem]:
    """Problems of a chain given in seq order; nothing for an intact chain."""
    expected_seq = 1
    prev_hash = GENESIS
    for row in rows:
        seq = int(row["seq"])
        if seq < expected_seq:
            yield ChainProblem(seq, "out_of_order", f"audit_log seq {seq}: out of order or duplicated")
            continue
        if seq > expected_seq:
            gap = f"{expected_seq}" if seq == expected_seq + 1 else f"{expected_seq}-{seq - 1}"
            yield ChainProblem(expected_seq, "missing", f"audit_log seq {gap}: deleted (the chain skips it)")
        if row["prev_hash"] != prev_hash:
            yield ChainProblem(
                seq,
                "relinked",
                f"audit_log seq {seq}: prev_hash does not match the row before it "
                "(a row before it was deleted, inserted or rewritten)",
            )
        if row_hash(row, row["prev_hash"]) != row["hash"]:
            yield ChainProblem(seq, "edited", f"audit_log seq {seq}: edited (its content does not match its hash)")
        expected_seq = seq + 1
        prev_hash = row["hash"]
