"""A container's claim from what the Docker Engine API says about it: pure functions, no I/O.

GPUs a container was given come from, in this order:

* ``HostConfig.DeviceRequests`` (``docker run --gpus``, or CDI ``--device nvidia.com/gpu=...``).
  For the NVIDIA driver the daemon turns a request into ``NVIDIA_VISIBLE_DEVICES`` of the OCI
  spec (not of ``Config.Env``): its device ids joined, ``Count`` n > 0 the first n indices
  ``0..n-1``, ``Count`` -1 ``all``, ``Count`` 0 ``void`` (moby ``daemon/nvidia_linux.go``). A
  request with driver ``""`` is matched by capability: ``--gpus`` asks for ``[["gpu"]]``.
* else ``NVIDIA_VISIBLE_DEVICES`` in ``Config.Env`` (the NVIDIA runtime as default runtime): a
  comma list of indices, UUIDs or MIG ids; ``all``; ``none``, ``void`` or empty for no GPU.
  CUDA base images set ``all`` in the image's environment, so without the NVIDIA runtime such a
  container may claim GPUs it cannot open; a claim is "who may use", never "who does".

Indices are resolved to UUIDs against the GPU list in NVML's index order (``nvidia-smi``'s), the
order the NVIDIA container toolkit uses.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Mapping, Sequence
from typing import Any

from gpuledger.core.redaction.redact import Redactor
from gpuledger.node.claims import Allocation, ContainerClaim

_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")
_CDI_GPU = "nvidia.com/gpu="
# Keys of an event's Actor.Attributes that are not labels (the daemon mixes labels in).
_EVENT_KEYS = frozenset({"image", "name", "exitCode", "execDuration", "signal"})


def docker_time_ns(text: str | bytes | None) -> int | None:
    """Nanoseconds since the epoch of an RFC 3339 time as Docker writes it; None for Go's zero time."""
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    m = _TIME.fullmatch(text or "")
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    if year < 1970:  # "0001-01-01T00:00:00Z": never started / not finished
        return None
    try:
        seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    zone = m.group(8)
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        seconds -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return seconds * 1_000_000_000 + int((m.group(7) or "0").ljust(9, "0"))


def docker_time(text: str | None) -> float | None:
    ns = docker_time_ns(text)
    return None if ns is None else ns / 1e9


def gpus_from_env(env: Sequence[str] | None) -> tuple[str, ...] | None:
    """GPUs named by ``NVIDIA_VISIBLE_DEVICES`` in a ``KEY=value`` list; None when it is not set."""
    value = None
    for item in env or ():
        if isinstance(item, str) and item.startswith("NVIDIA_VISIBLE_DEVICES="):
            value = item.split("=", 1)[1]  # the last one wins, as in the process's environment
    if value is None:
        return None
    return _device_list(value)


def _device_list(value: str) -> tuple[str, ...]:
    value = value.strip()
    if value.lower() in ("", "void", "none"):
        return ()  # the toolkit's "no GPU" values
    tokens = [t.strip() for t in value.split(",") if t.strip()]
    return ("all",) if any(t.lower() == "all" for t in tokens) else tuple(dict.fromkeys(tokens))


def gpus_from_device_requests(requests: Sequence[Mapping[str, Any]] | None) -> tuple[str, ...] | None:
    """GPUs asked for by ``HostConfig.DeviceRequests``; None when no request is for NVIDIA GPUs."""
    found: list[str] | None = None
    for req in requests or ():
        if not isinstance(req, Mapping):
            continue
        driver = str(req.get("Driver") or "").lower()
        ids = [str(d) for d in req.get("DeviceIDs") or () if isinstance(d, str)]
        if driver == "cdi":
            gpus = [d[len(_CDI_GPU) :] for d in ids if d.startswith(_CDI_GPU)]
            if not gpus:
                continue
            tokens = list(_device_list(",".join(gpus)))
        elif driver == "nvidia" or (driver == "" and _asks_for_gpu(req.get("Capabilities"))):
            count = req.get("Count") or 0
            if ids:
                tokens = list(_device_list(",".join(ids)))
            elif isinstance(count, int) and count < 0:
                tokens = ["all"]
            elif isinstance(count, int) and count > 0:
                tokens = [str(i) for i in range(count)]
            else:
                tokens = []  # Count 0, no ids: the daemon sets "void"
        else:
            continue
        found = (found or []) + tokens
    if found is None:
        return None
    return ("all",) if "all" in found else tuple(dict.fromkeys(found))


def _asks_for_gpu(capabilities: Any) -> bool:
    """Capabilities is a list of alternatives, each a list of capabilities that must all hold."""
    if not isinstance(capabilities, list):
        return False
    return any(isinstance(alt, list) and ("gpu" in alt or "nvidia" in alt) for alt in capabilities)


def container_gpus(doc: Mapping[str, Any]) -> tuple[str, ...] | None:
    host = doc.get("HostConfig") or {}
    from_requests = gpus_from_device_requests(host.get("DeviceRequests"))
    if from_requests is not None:
        return from_requests
    return gpus_from_env((doc.get("Config") or {}).get("Env"))


def claim_from_inspect(doc: Mapping[str, Any], redactor: Redactor) -> ContainerClaim | None:
    """The claim of an inspected container; None for one that never started."""
    state = doc.get("State") or {}
    config = doc.get("Config") or {}
    started = docker_time(state.get("StartedAt"))
    cid = doc.get("Id")
    if not isinstance(cid, str) or started is None:
        return None
    running = bool(state.get("Running"))
    finished = None if running else docker_time(state.get("FinishedAt"))
    if finished is not None:
        finished = max(finished, started)  # the daemon stamps a fast exit a hair before its start
    pid = state.get("Pid")
    exit_code = state.get("ExitCode")
    return ContainerClaim(
        id=cid,
        name=str(doc.get("Name") or "").lstrip("/") or None,
        image=config.get("Image") or doc.get("Image") or None,
        labels=redactor.redact_mapping(_str_map(config.get("Labels"))),
        gpus=container_gpus(doc),
        pid=pid if isinstance(pid, int) and pid > 0 else None,
        started_at=started,
        finished_at=finished,
        exit_code=exit_code if not running and isinstance(exit_code, int) else None,
    )


def claim_from_event(event: Mapping[str, Any], redactor: Redactor) -> ContainerClaim | None:
    """What a start/die event alone says, for a container gone before it could be inspected."""
    actor = event.get("Actor") or {}
    cid = actor.get("ID") or event.get("id")
    if not isinstance(cid, str):
        return None
    attrs = _str_map(actor.get("Attributes"))
    t = event_time(event)
    dead = event.get("Action") == "die"
    return ContainerClaim(
        id=cid,
        name=attrs.get("name"),
        image=attrs.get("image"),
        labels=redactor.redact_mapping({k: v for k, v in attrs.items() if k not in _EVENT_KEYS}),
        started_at=None if dead else t,
        finished_at=t if dead else None,
        exit_code=event_exit_code(event),
    )


def event_time(event: Mapping[str, Any]) -> float | None:
    nano = event.get("timeNano")
    if isinstance(nano, int) and nano > 0:
        return nano / 1e9
    t = event.get("time")
    return float(t) if isinstance(t, (int, float)) and t > 0 else None


def event_exit_code(event: Mapping[str, Any]) -> int | None:
    code = _str_map((event.get("Actor") or {}).get("Attributes")).get("exitCode")
    return int(code) if code is not None and code.lstrip("-").isdigit() else None


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items() if v is not None}


def allocations(claim: ContainerClaim, gpus: Mapping[int, str] | None) -> tuple[list[Allocation], list[str]]:
    """One Allocation per GPU the container was given (``gpus``: NVML index -> UUID), and the
    device ids that could not be resolved (an index with no GPU list or no such GPU, MIG
    ``<gpu>:<slice>`` indices)."""
    out: list[Allocation] = []
    unresolved: list[str] = []
    for token in claim.gpus or ():
        if token == "all":
            if gpus is None:
                unresolved.append(token)
            resolved = [gpus[i] for i in sorted(gpus or {})]
        elif token.isdigit():
            uuid = None if gpus is None else gpus.get(int(token))
            if uuid is None:
                unresolved.append(token)
                continue
            resolved = [uuid]
        elif token.upper().startswith(("GPU-", "MIG-")):
            resolved = [token]
        else:
            unresolved.append(token)
            continue
        out += [Allocation(gpu=u, kind="container", owner=claim.id) for u in resolved]
    return list({a.gpu: a for a in out}.values()), unresolved
