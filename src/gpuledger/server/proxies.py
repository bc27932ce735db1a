"""Which peers may say who the client is (``gpuledger serve --trusted-proxy CIDR``).

uvicorn believes ``X-Forwarded-For`` from 127.0.0.1 unless told otherwise, so any local process
(or a proxy that passes the header through) could name a new address on every request and never
meet the per-address rate limit (limits.py). By default nobody is trusted: the peer address is
the client. With ``--trusted-proxy`` (repeatable; a CIDR or an address) uvicorn takes the client
from ``X-Forwarded-For`` only when the peer is one of them. ``X-Real-IP`` is never read.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any


def parse(values: Iterable[str]) -> list[str]:
    """The networks as CIDR text; ValueError naming a value that is not an address or a network."""
    out = []
    for value in values:
        for part in value.replace(",", " ").split():
            try:
                out.append(str(ipaddress.ip_network(part, strict=False)))
            except ValueError:
                raise ValueError(f"--trusted-proxy {part!r}: an address or a CIDR such as 10.0.0.0/8") from None
    return out


def uvicorn_options(networks: list[str]) -> dict[str, Any]:
    """uvicorn.run keyword arguments: proxy headers only from ``networks``, none when empty."""
    if not networks:
        return {"proxy_headers": False}
    return {"proxy_headers": True, "forwarded_allow_ips": ",".join(networks)}
