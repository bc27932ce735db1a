"""A one-way channel from code running inside CMD (integrations) to the recorder.

CMD's processes find the socket path in ``GPULEDGER_CONTROL`` and send small JSON datagrams
(epoch ends, metrics, metadata, failure events). Datagrams are fire-and-forget: if the recorder
is gone (``kill -9``) a send fails silently and training goes on. Only the recorder writes to the
ledger, so an epoch boundary can also close the current interval exactly at that moment.

Message shape: ``{"type": "...", "t": epoch_seconds, ...}``; types used: ``epoch_end``
(``epoch``, ``metrics``), ``metrics`` (``metrics``, ``epoch``/``step``), ``event`` (``kind``,
``message``, ``payload``), ``metadata`` (``labels``, ``meta``), ``attempt_of`` (``run_id``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Mapping

ENV_VAR = "GPULEDGER_CONTROL"
MAX_DATAGRAM_B = 200_000  # below Linux's default socket buffer (212,992 bytes)


class ControlServer:
    def __init__(self, path: str) -> None:
        self.path = path
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(path)
        os.chmod(path, 0o600)
        self._sock.setblocking(False)

    def fileno(self) -> int:
        return self._sock.fileno()

    def receive(self) -> list[dict]:
        """Every message waiting now; malformed ones are dropped (they come from user code)."""
        messages = []
        while True:
            try:
                data = self._sock.recv(MAX_DATAGRAM_B + 1)
            except (BlockingIOError, InterruptedError):
                return messages
            except OSError:
                return messages
            try:
                msg = json.loads(data)
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(msg, dict) and isinstance(msg.get("type"), str):
                messages.append(msg)

    def close(self) -> None:
        self._sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class ControlClient:
    """Sends messages to the recorder named by ``GPULEDGER_CONTROL``; never raises."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._sock: socket.socket | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ControlClient | None:
        env = os.environ if env is None else env
        path = env.get(ENV_VAR)
        return cls(path) if path else None

    def send(self, msg_type: str, **fields: object) -> bool:
        msg = {"type": msg_type, "t": fields.pop("t", None) or time.time(), **fields}
        try:
            data = json.dumps(msg, default=str, allow_nan=True).encode()
        except (TypeError, ValueError):
            return False
        if len(data) > MAX_DATAGRAM_B:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.sendto(data, self.path)
            return True
        except OSError:
            return False
