"""Where the callbacks' messages go: the recorder of ``gpuledger run`` or an in-process ``track()``.

- Inside ``gpuledger run``: ``GPULEDGER_CONTROL`` names the recorder's socket; messages are
  datagrams (control.py), fire-and-forget.
- Inside ``gpuledger.track()``: the session registered with ``active_session`` receives them
  directly (messages.handle with ``cut=False``: the recorder thread owns interval cutting, so per
  epoch figures are shared out in proportion to time, see core/training/epochs.py).

Nothing here raises: a sink that cannot deliver drops the message.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpuledger.recorder.session import Session


class Sink(Protocol):
    def send(self, msg_type: str, **fields: object) -> bool: ...  # False: known not delivered


class ControlSink:
    def __init__(self, client: object) -> None:
        self._client = client

    def send(self, msg_type: str, **fields: object) -> bool:
        try:
            return bool(self._client.send(msg_type, **fields))  # type: ignore[attr-defined]
        except Exception:
            return False


class SessionSink:
    """Applies messages to an in-process session, as its recorder would from the socket."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def send(self, msg_type: str, **fields: object) -> bool:
        import time

        from gpuledger.recorder.messages import handle

        msg = {"type": msg_type, "t": fields.pop("t", None) or time.time(), **fields}
        try:
            handle(self.session, self.session.recorder, msg, cut=False)
        except Exception:
            return False
        return True


# -- the in-process session registry ------------------------------------------------------------
# A stack, because track() blocks may nest; entries remember their pid so a forked child
# (data-loader worker) never writes into its parent's session.
_active: list[tuple[int, Session]] = []
_lock = threading.Lock()


@contextmanager
def active_session(session: Session) -> Iterator[Session]:
    """Make ``session`` the one integrations in this process report to, for the block's duration."""
    entry = (os.getpid(), session)
    with _lock:
        _active.append(entry)
    try:
        yield session
    finally:
        with _lock:
            if entry in _active:
                _active.remove(entry)


def current_session() -> Session | None:
    with _lock:
        for pid, session in reversed(_active):
            if pid == os.getpid():
                return session
    return None


def resolve() -> Sink | None:
    """The sink for this process now: the innermost in-process session, else ``gpuledger run``'s."""
    session = current_session()
    if session is not None:
        return SessionSink(session)
    from gpuledger.recorder.control import ControlClient

    client = ControlClient.from_env()
    return ControlSink(client) if client is not None else None
