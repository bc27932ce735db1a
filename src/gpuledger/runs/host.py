"""The host a run is recorded on: the name runs, agents and ``gpuledger top`` agree on."""

from __future__ import annotations

import socket


def host_name() -> str:
    return socket.gethostname()
