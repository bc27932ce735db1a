"""Large reads streamed from the database: a run's export (CSV / JSON Lines), its interval pages
and its log (store/log_stream.py: read and decompressed a piece at a time).

Rows come from a server-side cursor (store/server_queries.stream), ``Settings.stream_rows`` per
round trip, and leave as soon as they are formatted, so a run of any length costs the memory of one
fetch; before, 200,000 intervals cost 400 MB. Each stream holds a database connection while it
runs, so at most ``Settings.max_streams`` run at once per process; one more is answered 429 with
Retry-After. The first rows are read before the answer starts, so a failing query is still a
proper error status rather than a cut-off 200.
"""

from __future__ import annotations

import io
import json
import math
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Any

import anyio
from fastapi import HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

CHUNK_ROWS = 1000  # rows formatted into one piece of the answer


def gate(request: Request) -> threading.Semaphore:
    state = request.app.state
    if getattr(state, "streams", None) is None:
        state.streams = threading.BoundedSemaphore(max(1, state.settings.max_streams))
    return state.streams


def export_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A database row in the export's shape (reports/run/export.py): throttle_s as sorted JSON text."""
    out = dict(row)
    if out.get("throttle_s") is not None:
        out["throttle_s"] = json.dumps(out["throttle_s"], sort_keys=True)
    return out


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def json_text(row: Mapping[str, Any]) -> str:
    """Strict JSON of one row; a non-finite number becomes the string "NaN" / "Infinity"."""
    try:
        return json.dumps(row, allow_nan=False)
    except ValueError:
        return json.dumps({k: _finite(v) for k, v in row.items()}, allow_nan=False)


def _batched(rows: Iterable[Any], n: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= n:
            yield batch
            batch = []
    if batch:
        yield batch


def csv_parts(rows: Iterable[Mapping[str, Any]], columns: list[str]) -> Iterator[bytes]:
    """The export's CSV, formula-like text cells neutralised as ``gpuledger export`` does (reports/safe_csv.py)."""
    from gpuledger.reports.run.export import NUMERIC_COLUMNS
    from gpuledger.reports.safe_csv import SafeCsvWriter

    out = io.StringIO()
    writer = SafeCsvWriter(out, columns, NUMERIC_COLUMNS)
    yield out.getvalue().encode()
    for batch in _batched(rows, CHUNK_ROWS):
        out.seek(0)
        out.truncate()
        writer.writerows([export_row(row).get(c) for c in columns] for row in batch)
        yield out.getvalue().encode()


def jsonl_parts(rows: Iterable[Mapping[str, Any]]) -> Iterator[bytes]:
    for batch in _batched(rows, CHUNK_ROWS):
        yield "".join(json_text(export_row(r)) + "\n" for r in batch).encode()


def pages_parts(series: Iterable[tuple[str, Callable[[], Iterator[Mapping[str, Any]]]]]) -> Iterator[bytes]:
    """``{"gpu": [...], "host": [...]}`` written as the rows come; each list's rows are opened in
    turn (one cursor at a time)."""
    yield b"{"
    for i, (name, open_rows) in enumerate(series):
        yield (", " if i else "").encode() + json.dumps(name).encode() + b": ["
        rows = open_rows()
        try:
            first = True
            for batch in _batched(rows, CHUNK_ROWS):
                text = ", ".join(json_text(export_row(r)) for r in batch)
                yield ((", " if not first else "") + text).encode()
                first = False
        finally:
            close = getattr(rows, "close", None)
            if close is not None:
                close()
        yield b"]"
    yield b"}"


async def respond(
    request: Request, parts: Iterator[bytes], media_type: str, headers: Mapping[str, str] | None = None
) -> StreamingResponse:
    """A streaming answer of ``parts`` (a generator holding a cursor), within the stream limit."""
    streams = gate(request)
    if not streams.acquire(blocking=False):
        close = getattr(parts, "close", None)
        if close is not None:
            close()
        limit = request.app.state.settings.max_streams
        raise HTTPException(
            status_code=429,
            detail=f"this server streams at most {limit} exports, interval pages or logs at once; retry in a second",
            headers={"Retry-After": "1"},
        )
    released = False

    async def finish() -> None:
        nonlocal released
        if not released:
            released = True
            with anyio.CancelScope(shield=True):
                await run_in_threadpool(getattr(parts, "close", lambda: None))
            streams.release()

    try:
        first = await run_in_threadpool(next, parts, None)
    except BaseException:
        await finish()
        raise

    async def body() -> AsyncIterator[bytes]:
        try:
            chunk = first
            while chunk is not None:
                yield chunk
                chunk = await run_in_threadpool(next, parts, None)
        finally:
            await finish()

    return StreamingResponse(body(), media_type=media_type, headers=dict(headers or {}))
