"""The capacity ledger's data model: every GPU-second of the fleet in exactly one state. Pure.

A physical GPU is, at every instant, in exactly one of four states (docs/CAPACITY.md):

* ``unallocated`` — no run, job, container or pod held it, and it was not busy;
* ``alloc_idle`` — held (allocated), not busy;
* ``busy_attr`` — busy while a process with a known owner was on it;
* ``busy_unattr`` — busy, but no owner was found (a process outside the agent's PID namespace,
  work the driver measured while it listed no process ...).

*Held* is allocation (who may use the GPU): a run (wrapped or discovered) holding it, a platform's
allocation (``Claims.allocations``: a container, pod or Slurm job given it), or a process with an
owner on it. *Busy* is use (who does): the driver's busy time. The two are kept apart, so a GPU
a pod was given and never touched is ``alloc_idle``, and one somebody used without asking is busy.

Exactness: times are integer milliseconds since the epoch, states integer milliseconds, and each
interval's four states add up to its span exactly (``CapacityInterval.check``). Splitting an
interval at UTC midnights (``split_days``) and turning milliseconds into the cost model's
micro-GPU-hours (``to_uh``) apportion by largest remainder, so every part still adds up exactly.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "DAY_MS",
    "MAX_GPU_POWER_W",
    "STATES",
    "WIRE_COLUMNS",
    "CapacityDay",
    "CapacityInterval",
    "FleetGpu",
    "HostStay",
    "Reading",
    "Sighting",
    "States",
    "apportion",
    "classify",
    "merge_days",
    "ms",
    "plausible_energy",
    "split_days",
    "to_uh",
]

DAY_MS = 86_400_000
STATES = ("unallocated", "alloc_idle", "busy_attr", "busy_unattr")
# One interval in the wire form of POST /api/v1/capacity (an agent's push to its team server)
WIRE_COLUMNS = (
    "gpu_uuid", "host", "t0_ms", "t1_ms", "unallocated_ms", "alloc_idle_ms", "busy_attr_ms", "busy_unattr_ms",
    "unmeasured_ms", "energy_j",
)  # fmt: skip
SOURCES = ("agent", "runs")  # measured by a node agent; derived from recorded runs (no agent)


def ms(t: float) -> int:
    """Epoch seconds -> integer epoch milliseconds (every edge is rounded once, where it enters)."""
    return round(t * 1000)


# No GPU draws this much on average (the largest parts are rated at about 1.2 kW): more is a broken
# counter or a bad payload, and energy that large overflows the 64-bit sums of the report's columns.
MAX_GPU_POWER_W = 5_000.0


def plausible_energy(energy_j: float | None, span_ms: int) -> bool:
    """Whether ``energy_j`` over ``span_ms`` is a mean power a GPU can draw (None: not measured)."""
    return energy_j is None or energy_j <= MAX_GPU_POWER_W * max(span_ms, 1) / 1000


@dataclass(frozen=True, slots=True)
class States:
    """Milliseconds in each state (STATES order)."""

    unallocated_ms: int = 0
    alloc_idle_ms: int = 0
    busy_attr_ms: int = 0
    busy_unattr_ms: int = 0

    @property
    def total_ms(self) -> int:
        return self.unallocated_ms + self.alloc_idle_ms + self.busy_attr_ms + self.busy_unattr_ms

    @property
    def allocated_ms(self) -> int:
        """Held time: allocated-idle and busy-attributed (a busy GPU with an owner is held by it)."""
        return self.alloc_idle_ms + self.busy_attr_ms

    @property
    def busy_ms(self) -> int:
        return self.busy_attr_ms + self.busy_unattr_ms

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.unallocated_ms, self.alloc_idle_ms, self.busy_attr_ms, self.busy_unattr_ms)

    def __add__(self, other: States) -> States:
        return States(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple(), strict=True)))


@dataclass(frozen=True, slots=True)
class Reading:
    """What one agent reading says about one physical GPU (a MIG-mode GPU with its slices)."""

    span_ms: int
    busy_ms: int | None  # the driver's busy time; None: not measured (MIG, lost GPU, first read)
    held: bool  # a run, a platform allocation or an owned process holds it
    in_use: bool  # a process is on it (owned or not)
    attributed: bool  # a process with a known owner is on it
    unknown_ms: int = 0  # part of the span the driver's samples could not cover (not in busy_ms)


def classify(r: Reading) -> States:
    """The states of one reading. Busy time the driver did not measure (all of it, or the unknown
    part of a measured reading) counts as busy while a process is on the GPU and as not busy
    otherwise; an owned process makes the GPU held."""
    span = max(0, r.span_ms)
    if r.busy_ms is None:
        busy = span if r.in_use else 0
    else:
        busy = min(span, max(0, r.busy_ms) + (max(0, r.unknown_ms) if r.in_use else 0))
    held = r.held or r.attributed
    if not held:
        return States(unallocated_ms=span - busy, busy_unattr_ms=busy)
    if r.attributed:
        return States(alloc_idle_ms=span - busy, busy_attr_ms=busy)
    return States(alloc_idle_ms=span - busy, busy_unattr_ms=busy)


@dataclass(frozen=True, slots=True)
class CapacityInterval:
    """One GPU's states over [t0_ms, t1_ms), as a node agent recorded them (table gpu_capacity).
    ``unmeasured_ms``: the part of the span whose busy time the driver did not give (its state was
    decided by whether a process was on the GPU); ``energy_j``: the device's energy, None when not
    measured."""

    gpu_uuid: str
    host: str
    t0_ms: int
    t1_ms: int
    states: States
    unmeasured_ms: int = 0
    energy_j: float | None = None

    @property
    def span_ms(self) -> int:
        return self.t1_ms - self.t0_ms

    def check(self) -> None:
        """ValueError unless the states are non-negative and add up to the span exactly."""
        values = self.states.as_tuple()
        if self.t1_ms < self.t0_ms:
            raise ValueError(f"{self.gpu_uuid}: interval ends ({self.t1_ms}) before it starts ({self.t0_ms})")
        if min(values) < 0 or self.unmeasured_ms < 0:
            raise ValueError(f"{self.gpu_uuid} at {self.t0_ms}: a negative state")
        if sum(values) != self.span_ms:
            raise ValueError(f"{self.gpu_uuid} at {self.t0_ms}: states add up to {sum(values)} ms, span {self.span_ms}")
        if self.unmeasured_ms > self.span_ms:
            raise ValueError(f"{self.gpu_uuid} at {self.t0_ms}: unmeasured time longer than the interval")
        if self.energy_j is not None and not self.energy_j >= 0:
            raise ValueError(f"{self.gpu_uuid} at {self.t0_ms}: energy must be a non-negative number")
        if not plausible_energy(self.energy_j, self.span_ms):
            raise ValueError(
                f"{self.gpu_uuid} at {self.t0_ms}: {self.energy_j} J in {self.span_ms} ms is a mean power above "
                f"{MAX_GPU_POWER_W:.0f} W, more than any GPU draws"
            )


@dataclass(frozen=True, slots=True)
class CapacityDay:
    """One GPU's states on one UTC day on one host (table gpu_capacity_days): the sums of its
    intervals' parts in that day. ``first_ms`` / ``last_ms``: the first and last instant covered."""

    gpu_uuid: str
    day: int  # days since 1970-01-01 UTC
    host: str
    first_ms: int
    last_ms: int
    states: States
    unmeasured_ms: int = 0
    energy_j: float | None = None
    intervals: int = 0  # intervals that end in this day
    source: str = "agent"

    @property
    def span_ms(self) -> int:
        return self.states.total_ms


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to non-negative integer ``weights`` into integers that add up
    to it exactly: floors of the exact quotas, the rest one each to the largest remainders (ties to
    the earlier weight). All zero weights: everything to the first part."""
    whole = sum(weights)
    if whole <= 0:
        return [total] + [0] * (len(weights) - 1) if weights else []
    scaled = [total * w for w in weights]
    parts = [x // whole for x in scaled]
    left = total - sum(parts)
    if left:
        remainders = [x % whole for x in scaled]
        for i in sorted(range(len(weights)), key=lambda i: (-remainders[i], i))[:left]:
            parts[i] += 1
    return parts


def _cuts(t0_ms: int, t1_ms: int) -> list[int]:
    first = t0_ms // DAY_MS + 1
    return [d * DAY_MS for d in range(first, (t1_ms - 1) // DAY_MS + 1)] if t1_ms > t0_ms else []


def split_days(iv: CapacityInterval, source: str = "agent") -> list[CapacityDay]:
    """The interval's parts in each UTC day it touches. Each state is handed out part by part in
    proportion to the parts' lengths (largest remainder among what is left), so every part's
    states add up to its length and every state's parts to the interval's figure."""
    edges = [iv.t0_ms, *_cuts(iv.t0_ms, iv.t1_ms), iv.t1_ms]
    left = list(iv.states.as_tuple())
    unmeasured_left, span_left = iv.unmeasured_ms, iv.span_ms
    out = []
    for n, (a, b) in enumerate(itertools.pairwise(edges)):
        part = b - a
        last = n == len(edges) - 2
        if last:
            states, unmeasured = list(left), unmeasured_left
        else:
            # quotas left_i x part / span_left add up to part, each at most left_i: so do the parts
            states = apportion(part, left) if span_left else [0, 0, 0, 0]
            unmeasured = unmeasured_left * part // span_left if span_left else 0
        energy = None
        if iv.energy_j is not None:
            energy = iv.energy_j * (part / iv.span_ms) if iv.span_ms else iv.energy_j
        day = a // DAY_MS
        out.append(CapacityDay(iv.gpu_uuid, day, iv.host, a, b, States(*states), unmeasured, energy, int(last), source))
        left = [x - y for x, y in zip(left, states, strict=True)]
        unmeasured_left -= unmeasured
        span_left -= part
    return out


def merge_days(days: Iterable[CapacityDay]) -> list[CapacityDay]:
    """Day parts summed per (GPU, day, host, source), sorted."""
    acc: dict[tuple[str, int, str, str], CapacityDay] = {}
    for d in days:
        key = (d.gpu_uuid, d.day, d.host, d.source)
        prev = acc.get(key)
        if prev is None:
            acc[key] = d
            continue
        energy = prev.energy_j if d.energy_j is None else d.energy_j + (prev.energy_j or 0.0)
        acc[key] = CapacityDay(
            d.gpu_uuid, d.day, d.host, min(prev.first_ms, d.first_ms), max(prev.last_ms, d.last_ms),
            prev.states + d.states, prev.unmeasured_ms + d.unmeasured_ms, energy,
            prev.intervals + d.intervals, d.source,
        )  # fmt: skip
    return [acc[k] for k in sorted(acc)]


def uh_of(span_ms: int) -> int:
    """Milliseconds -> micro-GPU-hours (1 µh = 3.6 ms), rounded half up once."""
    return (span_ms * 10 + 18) // 36


def to_uh(parts_ms: Sequence[int]) -> list[int]:
    """Milliseconds of the parts of one span (states, unobserved ...) -> micro-GPU-hours that add up
    exactly to the span's (``uh_of`` of their sum)."""
    return apportion(uh_of(sum(parts_ms)), parts_ms)


@dataclass(frozen=True, slots=True)
class HostStay:
    """A GPU's time on one host: its first and last sighting there (epoch seconds), and the cloud
    instance type that host's agent named (None: none, the GPU is priced by its model there)."""

    host: str
    first_seen: float
    last_seen: float
    instance_type: str | None = None


@dataclass(frozen=True, slots=True)
class FleetGpu:
    """One physical GPU of the fleet, followed by its UUID wherever it goes (table gpu_fleet).

    ``host`` is where it was last seen; ``hosts`` every host it was seen on, oldest first (a GPU
    that moved has several). ``source``: ``agent`` when a node agent has seen it, ``runs`` when it
    is known only from the runs recorded on it (a wrapped-only deployment)."""

    uuid: str
    name: str
    host: str
    first_seen: float
    last_seen: float
    hosts: tuple[HostStay, ...] = ()
    instance_type: str | None = None
    memory_total_b: int | None = None
    source: str = "agent"
    extra: dict[str, str] = field(default_factory=dict)  # pci_bus_id, mig_mode ... as the agent saw them

    def instance_on(self, host: str) -> str | None:
        """The instance type the GPU is priced as while on ``host``: what that host's agent named
        (a GPU moved from a cloud instance to an on-prem node is not priced as the instance there);
        ``instance_type`` for a host it has no stay on."""
        for stay in self.hosts:
            if stay.host == host:
                return stay.instance_type
        return self.instance_type


@dataclass(frozen=True, slots=True)
class Sighting:
    """A physical GPU a node agent saw on ``host`` from ``first_seen`` to ``last_seen`` (epoch
    seconds): what the agent reports with its capacity intervals, folded into the fleet."""

    uuid: str
    name: str
    host: str
    first_seen: float
    last_seen: float
    instance_type: str | None = None
    memory_total_b: int | None = None
    pci_bus_id: str | None = None
    mig_mode: str | None = None
