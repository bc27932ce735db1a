"""The node agent's capacity meter: each reading's span of every physical GPU put into one state,
summed into one interval per GPU at each of the agent's interval boundaries. Pure: the agent hands
it what each reading found (``GpuFacts``) and the reading's edges.

Readings are contiguous (each covers the time since the previous one), so an interval's states add
up to its span exactly: edges are rounded to milliseconds once, each reading's span is the
difference of two rounded edges, and the spans telescope. A GPU missing from a reading, or a gap
between readings, starts a new interval instead of bridging the gap. A reading that starts before
the end of the previous one (a clock stepped back, a reading that failed half-way) counts only
from that end: no millisecond of a GPU is ever in two intervals.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuledger.core.capacity.model import CapacityInterval, Reading, Sighting, States, classify, ms, plausible_energy
from gpuledger.core.model import GpuIdentity

__all__ = ["CapacityMeter", "GpuFacts", "physical_gpus"]


def physical_gpus(devices: Iterable[GpuIdentity]) -> dict[str, GpuIdentity]:
    """The physical GPUs among NVML's devices, by UUID. In MIG mode NVML lists a GPU's slices, not
    the GPU: the GPU is named from a slice's name ("NVIDIA A100-SXM4-80GB MIG 3g.40gb" -> "NVIDIA
    A100-SXM4-80GB"); capacity is accounted for the whole GPU, the asset a rate card prices."""
    out: dict[str, GpuIdentity] = {}
    for d in devices:
        if d.mig_parent_uuid is None:
            out[d.uuid] = d
        elif d.mig_parent_uuid not in out:
            name = d.name.split(" MIG ")[0].strip() or d.name
            kept = {"driver_version": d.driver_version, "cuda_version": d.cuda_version, "source": d.source}
            out[d.mig_parent_uuid] = GpuIdentity(d.index, d.mig_parent_uuid, name, mig_mode="enabled", **kept)
    return out


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What one reading found about one physical GPU (a MIG-mode GPU: with its slices)."""

    busy_s: float | None  # the driver's busy time over the reading; None: not measured
    energy_j: float | None
    held: bool  # a run, a platform allocation or an owned process holds it
    in_use: bool  # a process is on it (owned or not)
    attributed: bool  # a process with a known owner is on it
    unknown_s: float = 0.0  # part of the reading the driver's samples could not cover (not in busy_s)


@dataclass(slots=True)
class _Open:
    t0_ms: int
    t1_ms: int
    states: States
    unmeasured_ms: int
    energy_j: float | None
    energy_seen: bool


class CapacityMeter:
    """See the module doc. ``add`` after every reading, ``close`` at every interval boundary."""

    def __init__(self, host: str, instance_type: str | None = None) -> None:
        self.host = host
        self.instance_type = instance_type
        self._open: dict[str, _Open] = {}
        self._done: list[CapacityInterval] = []
        self._end_ms: int | None = None  # the end of the latest reading

    def add(self, t0: float, t1: float, gpus: Mapping[str, GpuFacts]) -> None:
        """The reading covering [t0, t1): each GPU's span in one state (core/capacity/model.classify)."""
        a, b = ms(t0), ms(t1)
        if self._end_ms is not None and a < self._end_ms:
            a = self._end_ms  # already counted: only the rest of the reading is new
        if b <= a:
            return
        self._end_ms = b
        for uuid, f in gpus.items():
            busy_ms = None if f.busy_s is None else round(f.busy_s * 1000)
            unknown_ms = 0 if busy_ms is None else min(b - a, max(0, round(f.unknown_s * 1000)))
            states = classify(Reading(b - a, busy_ms, f.held, f.in_use, f.attributed, unknown_ms))
            unmeasured = b - a if busy_ms is None else unknown_ms
            acc = self._open.get(uuid)
            if acc is not None and acc.t1_ms != a:  # a gap: what came before is an interval of its own
                self._done.append(self._interval(uuid, acc))
                acc = None
            if acc is None:
                self._open[uuid] = _Open(a, b, states, unmeasured, f.energy_j, f.energy_j is not None)
                continue
            acc.t1_ms = b
            acc.states = acc.states + states
            acc.unmeasured_ms += unmeasured
            if f.energy_j is not None:
                acc.energy_j = f.energy_j + (acc.energy_j or 0.0)
                acc.energy_seen = True
        for uuid in [u for u, acc in self._open.items() if acc.t1_ms != b and acc.t1_ms <= a]:
            self._done.append(self._interval(uuid, self._open.pop(uuid)))  # not in this reading: ended

    def close(self, devices: Iterable[GpuIdentity] = ()) -> tuple[list[CapacityInterval], list[Sighting]]:
        """The intervals since the last close, and a sighting of each GPU they cover (its name and
        facts from ``devices``)."""
        out = self._done + [self._interval(uuid, acc) for uuid, acc in self._open.items()]
        self._done, self._open = [], {}
        known = {d.uuid: d for d in devices}
        spans: dict[str, tuple[int, int]] = {}
        for iv in out:
            lo, hi = spans.get(iv.gpu_uuid, (iv.t0_ms, iv.t1_ms))
            spans[iv.gpu_uuid] = (min(lo, iv.t0_ms), max(hi, iv.t1_ms))
        sightings = []
        for uuid, (lo, hi) in spans.items():
            d = known.get(uuid)
            facts = (d.memory_total_b, d.pci_bus_id, d.mig_mode) if d else (None, None, None)
            name = d.name if d else uuid
            sightings.append(Sighting(uuid, name, self.host, lo / 1000, hi / 1000, self.instance_type, *facts))
        return out, sightings

    def _interval(self, uuid: str, acc: _Open) -> CapacityInterval:
        energy = acc.energy_j if acc.energy_seen else None
        if not plausible_energy(energy, acc.t1_ms - acc.t0_ms):
            energy = None  # a broken counter reading: unmeasured, rather than a figure no GPU can reach
        return CapacityInterval(uuid, self.host, acc.t0_ms, acc.t1_ms, acc.states, acc.unmeasured_ms, energy)
