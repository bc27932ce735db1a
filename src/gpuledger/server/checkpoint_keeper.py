"""The server's audit checkpoint (store/audit_checkpoint.py): written on a timer, apart from any
request, and once more at shutdown; a chain found shortened meanwhile stops the server serving.

``gpuledger serve`` names the file (``GPULEDGER_AUDIT_CHECKPOINT``) and checks it before it
starts; each worker process keeps it from then on. Ingest never waits for it: a tick reads the
head (one row) and, when it moved and carries a good signature, writes the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi.concurrency import run_in_threadpool
from sqlalchemy.engine import Connection

from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, audit_checkpoint, audit_sign

_log = logging.getLogger("gpuledger.server")


class Keeper:
    """Keeps one ledger's checkpoint file up with its signed head."""

    def __init__(self, ledger: Ledger, path: Path, keys: audit_sign.WriterKeys, every_s: float) -> None:
        self.ledger, self.path, self.keys, self.every_s = ledger, path, keys, every_s
        self.engine = ledger.database.engine
        self.halted: str | None = None  # why this server no longer serves (a shortened chain)

    def tick(self) -> None:
        """Take a higher checkpoint from the file (another worker's), check the chain against the
        highest known, and write the head when it moved on and is signed."""
        try:
            there = audit_checkpoint.load(self.path)
        except audit_checkpoint.CheckpointError as exc:  # torn or edited while serving: written anew below
            _log.warning("%s", exc)
            there = None
        if there is not None and there.trusted_by(self.keys.trusted):
            audit_checkpoint.set_floor(self.engine, there, self.path)
        floor = audit_checkpoint.floor(self.engine)

        def read(conn: Connection) -> tuple[audit_sign.Head | None, str | None]:
            return audit_sign.head(conn), None if floor is None else audit_checkpoint.problem(conn, floor)

        head, why = self.ledger.read(read)
        if why is not None:
            self.halt(audit_checkpoint.refusal(why, self.path, None))
            return
        if head is None or (floor is not None and head.seq <= floor.seq):
            return
        if not self.keys.trusted.verify(head.seq, head.key_id, head.hash, head.sig):
            return  # rows appended without the key: the next signed append names them, then it is checkpointed
        cp = audit_checkpoint.sign(self.keys.signer, head.seq, head.hash, ledger=self.ledger.url)
        kept = audit_checkpoint.write(self.path, cp, self.keys.trusted)
        audit_checkpoint.set_floor(self.engine, kept, self.path)

    def halt(self, why: str) -> None:
        if self.halted is None:
            _log.error("gpuledger: %s", why)
        self.halted = why

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            await self.safe_tick()

    async def safe_tick(self) -> None:
        try:
            await run_in_threadpool(self.tick)
        except Exception as exc:  # the database may be away for a while: try again next time
            _log.warning("audit checkpoint not updated: %s", exc)


def from_env(ledger: Ledger, settings: Settings) -> Keeper | None:
    """A keeper when this process signs and ``gpuledger serve`` named the checkpoint file."""
    keys = audit_sign.writer_keys()
    path = os.environ.get(audit_checkpoint.ENV_PATH)
    if keys is None or not path:
        return None
    return Keeper(ledger, Path(path), keys, settings.checkpoint_every_s)


@contextlib.asynccontextmanager
async def keeping(keeper: Keeper | None) -> AsyncIterator[None]:
    """For the app's lifespan: keep the checkpoint while serving, write it once more at the end."""
    if keeper is None:
        yield
        return
    await keeper.safe_tick()  # before the first request: the head this process starts from
    task = asyncio.create_task(keeper.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await keeper.safe_tick()  # the last head this process saw


class Halt:
    """ASGI middleware: once the chain was found shortened, every request is answered 503 with why
    (a revoked token brought back by deleting its audit row must not work again)."""

    def __init__(self, app: Any, keeper: Keeper | None) -> None:
        self.app, self.keeper = app, keeper

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.keeper is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.keeper.halted is not None:
            await _refuse(send, self.keeper.halted)
            return
        started = False

        async def watch(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except audit_checkpoint.ChainShortened as exc:  # found by an append before the next tick
            self.keeper.halt(str(exc))
            if started:
                raise
            await _refuse(send, str(exc))


async def _refuse(send: Any, why: str) -> None:
    body = json.dumps({"detail": why}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})
