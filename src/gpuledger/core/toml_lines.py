"""Where things are in a TOML file: tomllib gives line numbers for syntax errors only, so a
value's line is found by scanning the text for its table header and its key. Good enough for the
usual layout (one key per line, or one inline table per line in an array)."""

from __future__ import annotations

import re

__all__ = ["Locator", "line_of"]


class Locator:
    """Finds the line (0-based) where an entry or a key of it is written."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.headers: list[tuple[int, str, bool]] = []  # (line, name, is array)
        for i, line in enumerate(self.lines):
            m = re.match(r"\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$", line)
            if m:
                self.headers.append((i, _unquote(m.group(2)), m.group(1) == "[["))
        self.header_lines = {h for h, _, _ in self.headers}

    def header(self, table: str, index: int | None = None, sub: str | None = None) -> int | None:
        if index is not None:
            found = [ln for ln, name, arr in self.headers if arr and name == table]
            if index < len(found):
                return found[index]
            return self.inline_item(table, index)
        wanted = f"{table}.{sub}" if sub is not None else table
        for ln, name, arr in self.headers:
            if not arr and name == wanted:
                return ln
        if sub is not None:  # [models] with KEY = { ... } inline
            return self.key(self.header(table), sub)
        return self.key(None, table)

    def inline_item(self, table: str, index: int) -> int | None:
        """Entry ``index`` of ``table = [ {...}, {...} ]``, one inline table per line."""
        start = self.key(None, table)
        if start is None:
            return None
        items = [i for i in range(start, len(self.lines)) if "{" in self.lines[i].split("#")[0]]
        return items[index] if index < len(items) else start

    def key(self, start: int | None, key: str) -> int | None:
        """The line of ``key = ...`` in the block after line ``start`` (None: before any header)."""
        pattern = re.compile(r"\s*[\"']?" + re.escape(key) + r"[\"']?\s*=")
        for i in range(0 if start is None else start + 1, len(self.lines)):
            if i in self.header_lines:
                break
            if pattern.match(self.lines[i]):
                return i
        if start is not None and start < len(self.lines) and "{" in self.lines[start]:
            return start  # a key inside an inline table is on the entry's own line
        return None


def line_of(problem: str) -> int:
    m = re.match(r"[^:]*:(\d+):", problem)
    return int(m.group(1)) if m else 0


def _unquote(name: str) -> str:
    return ".".join(
        part.strip().strip("\"'") for part in re.split(r"\.(?=(?:[^\"']*[\"'][^\"']*[\"'])*[^\"']*$)", name)
    )
