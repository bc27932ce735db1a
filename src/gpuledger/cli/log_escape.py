"""A stored log made safe for a terminal: ``gpuledger logs`` replays what a command printed, and
a log may hold a screen clear, a window-title (OSC) sequence or binary that a terminal would obey.

Kept as they are: newline, tab, carriage return (progress bars redraw their line) and SGR colour
sequences (``ESC [ 1;31 m``: colours and bold only, they cannot move the cursor or clear anything).
Every other control character (C0, DEL, C1 such as U+009B, the 8-bit CSI) and every byte that is
not UTF-8 is shown as text: ``\\x1b``, ``\\x07``, ``\\x9b``; so an ESC that starts anything but a
colour shows as ``\\x1b[2J`` and does nothing.
"""

from __future__ import annotations

import re

_SGR = re.compile(r"(\x1b\[[0-9;:]*m)")
# C0 but \t \n \r, DEL, C1, and the bytes that were not UTF-8 (surrogate escapes, U+DC80..U+DCFF)
_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\udc80-\udcff]")


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code - 0xDC00 if code >= 0xDC00 else code:02x}"


def escape_for_terminal(data: bytes) -> bytes:
    text = data.decode("utf-8", "surrogateescape")
    parts = _SGR.split(text)  # odd items: the colour sequences, kept
    safe = [part if i % 2 else _UNSAFE.sub(_shown, part) for i, part in enumerate(parts)]
    return "".join(safe).encode("utf-8")
