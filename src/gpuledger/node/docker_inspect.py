"""A container's claim from what the Docker Engine API says about it: pure functions, no I/O.

GPUs a container was given come from, in this order (the first that names any decides):

* ``HostConfig.DeviceRequests`` (``docker run --gpus``, or CDI ``--device nvidia.com/gpu=...``).
  For the NVIDIA driver the daemon turns a request into ``NVIDIA_VISIBLE_DEVICES`` of the OCI
  spec (not of ``Config.Env``): its device ids joined, ``Count`` n > 0 the first n indices
  ``0..n-1``, ``Count`` -1 ``all``, ``Count`` 0 ``void`` (moby ``daemon/nvidia_linux.go``). A
  request with driver ``""`` is matched by capability: ``--gpus`` asks for ``[["gpu"]]``.
* CDI annotations, ``HostConfig.Annotations`` (``docker run --annotation``, Engine 24+) whose key
  starts ``cdi.k8s.io/``: each value a comma list of CDI names (``nvidia.com/gpu=0``). The NVIDIA
  container runtime in CDI mode prefers them to everything below (NVIDIA container toolkit,
  ``internal/config/image/cuda_image.go``, ``VisibleDevices``; docs: "Container Device Interface").
* Volume mounts of ``/dev/null`` onto ``/var/run/nvidia-container-devices/<device>`` (the
  toolkit's ``accept-nvidia-visible-devices-as-volume-mounts``, which hardened nodes and the k8s
  device plugin's ``volume-mounts`` strategy use so an unprivileged container cannot pick GPUs by
  environment): the file name is the device, an index, a UUID or ``all``;
  ``cdi/<vendor>/<class>/<device>`` or ``cdi/<vendor>/<class>=<device>`` a CDI name; ``imex/...``
  IMEX channels, not GPUs. When there are such mounts the toolkit ignores the environment.
* else ``NVIDIA_VISIBLE_DEVICES`` in ``Config.Env`` (the image's environment merged with the
  container's): a comma list of indices, UUIDs, MIG ids or CDI names; ``all``; ``none``, ``void``
  or empty for no GPU. CUDA base images set ``all``, so without the NVIDIA runtime such a
  container may claim GPUs it cannot open; a claim is "who may use", never "who does". Whether
  the toolkit honours the variable at all (``accept-nvidia-visible-devices-envvar-when-unprivileged``
  is false on hardened nodes) is its config, which the Engine API does not show: the claim is kept.
* else an old ("legacy") CUDA image, one with ``CUDA_VERSION`` but neither
  ``NVIDIA_VISIBLE_DEVICES`` nor ``NVIDIA_REQUIRE_CUDA`` in its environment, run by the NVIDIA
  runtime (``HostConfig.Runtime`` "nvidia…", which the daemon fills in with its default runtime
  when none is asked): the toolkit gives it every GPU. Under another runtime nothing injects the
  GPUs (unless a prestart hook is installed by hand, which the API does not show): no claim.

Indices are resolved to UUIDs against the GPU list in NVML's index order (``nvidia-smi``'s), the
order the NVIDIA container toolkit uses.
"""

from __future__ import annotations

import calendar
import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Any

from gpuledger.core.redaction.redact import Redactor
from gpuledger.node.claims import Allocation, ContainerClaim

_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")
_CDI_GPU = "nvidia.com/gpu="
_CDI_ANNOTATION = "cdi.k8s.io/"  # the toolkit's default annotation prefix for CDI device requests
_DEVICE_MOUNT_ROOT = "/var/run/nvidia-container-devices"
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
    tokens = [_cdi_gpu(t.strip()) or t.strip() for t in value.split(",") if t.strip()]
    return ("all",) if any(t.lower() == "all" for t in tokens) else tuple(dict.fromkeys(tokens))


def _cdi_gpu(name: str) -> str | None:
    """The device of a CDI name of an NVIDIA GPU (``nvidia.com/gpu=1`` -> ``1``); None otherwise."""
    return (name[len(_CDI_GPU) :] or None) if name.startswith(_CDI_GPU) else None


def gpus_from_cdi_annotations(annotations: Mapping[str, Any] | None) -> tuple[str, ...] | None:
    """GPUs named by ``cdi.k8s.io/*`` annotations; None when none names an NVIDIA GPU."""
    names: list[str] = []
    for key in sorted(annotations or {}):  # sorted, as the toolkit reads them
        value = (annotations or {})[key]
        if isinstance(key, str) and key.startswith(_CDI_ANNOTATION) and isinstance(value, str):
            names += [n.strip() for n in value.split(",")]
    gpus = [g for g in map(_cdi_gpu, names) if g]
    return _device_list(",".join(gpus)) if gpus else None


def gpus_from_mounts(mounts: Sequence[Mapping[str, Any]] | None) -> tuple[str, ...] | None:
    """GPUs passed as ``/dev/null`` mounts under ``/var/run/nvidia-container-devices``; None when
    there are none (IMEX channels and other CDI classes are not GPUs)."""
    devices: list[str] = []
    for mount in mounts or ():
        if not isinstance(mount, Mapping):
            continue
        source = posixpath.normpath(str(mount.get("Source") or ""))
        target = posixpath.normpath(str(mount.get("Destination") or mount.get("Target") or ""))
        if source != "/dev/null" or not target.startswith(_DEVICE_MOUNT_ROOT + "/"):
            continue  # the toolkit reads only /dev/null mounted there
        device = target[len(_DEVICE_MOUNT_ROOT) + 1 :]
        if device.startswith("cdi/"):
            name = device[len("cdi/") :]
            if "=" not in name:  # cdi/<vendor>/<class>/<device>
                parts = name.split("/", 2)
                name = f"{parts[0]}/{parts[1]}={parts[2]}" if len(parts) == 3 else ""
            device = _cdi_gpu(name) or ""
        if device and not device.startswith("imex/"):
            devices.append(device)
    return _device_list(",".join(devices)) if devices else None


def _legacy_cuda_all(env: Sequence[str] | None, runtime: Any) -> bool:
    """An old CUDA image under the NVIDIA runtime: the toolkit gives it every GPU."""
    names = {item.split("=", 1)[0] for item in env or () if isinstance(item, str) and "=" in item}
    legacy = "CUDA_VERSION" in names and "NVIDIA_REQUIRE_CUDA" not in names
    # "nvidia", or "nvidia-cdi"/"nvidia-legacy" as `nvidia-ctk runtime configure` registers them.
    return legacy and "NVIDIA_VISIBLE_DEVICES" not in names and str(runtime or "").startswith("nvidia")


def gpus_from_device_requests(requests: Sequence[Mapping[str, Any]] | None) -> tuple[str, ...] | None:
    """GPUs asked for by ``HostConfig.DeviceRequests``; None when no request is for NVIDIA GPUs."""
    found: list[str] | None = None
    for req in requests or ():
        if not isinstance(req, Mapping):
            continue
        driver = str(req.get("Driver") or "").lower()
        ids = [str(d) for d in req.get("DeviceIDs") or () if isinstance(d, str)]
        if driver == "cdi":
            gpus = [g for g in map(_cdi_gpu, ids) if g]
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
    """The GPUs an inspected container was given, in the order of the module doc; None: no claim."""
    host = doc.get("HostConfig") or {}
    env = (doc.get("Config") or {}).get("Env")
    for found in (
        gpus_from_device_requests(host.get("DeviceRequests")),
        gpus_from_cdi_annotations(host.get("Annotations")),
        gpus_from_mounts(doc.get("Mounts")),
        gpus_from_env(env),
    ):
        if found is not None:
            return found
    return ("all",) if _legacy_cuda_all(env, host.get("Runtime")) else None


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
