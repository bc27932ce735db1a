"""The figures of the run this process records, fed by the Recorder's ``on_interval`` hook.

Counters are running sums of the closed intervals' integrals (kept in integer µs and mJ, exact, as
the server keeps them), gauges the latest interval's values. ``observe`` runs on the recorder
thread, ``snapshot`` on the HTTP server's threads.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuledger.core.model import GpuIdentity, GpuInterval, HostInterval, RunRecord
from gpuledger.prom.names import THROTTLE_REASONS
from gpuledger.prom.series import MICRO, MILLI, GpuFigures, RunFigures, RunKey, add, scaled, units


@dataclass
class _Device:
    index: int | None = None
    memory_total_b: int | None = None
    busy_us: int | None = None
    energy_mj: int | None = None
    throttle_us: dict[str, int] = field(default_factory=dict)
    power_w: float | None = None
    memory_used_b: int | None = None
    temperature_c: float | None = None

    def figures(self, uuid: str) -> GpuFigures:
        return GpuFigures(
            uuid=uuid,
            index=self.index,
            busy_s=scaled(self.busy_us, MICRO),
            energy_j=scaled(self.energy_mj, MILLI),
            throttle_s={k: v / MICRO for k, v in self.throttle_us.items()},
            power_w=self.power_w,
            memory_used_b=self.memory_used_b,
            memory_total_b=self.memory_total_b,
            temperature_c=self.temperature_c,
        )


class LiveRun:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._run: RunRecord | None = None
        self._gpus: dict[str, _Device] = {}
        self._cpu_us: int | None = None

    def bind(self, run: RunRecord, devices: Sequence[GpuIdentity]) -> None:
        """The run and its GPUs; labels are read from ``run`` at each scrape (integrations add some)."""
        with self._lock:
            self._run = run
            for dev in devices:
                d = self._gpus.setdefault(dev.uuid, _Device())
                d.index, d.memory_total_b = dev.index, dev.memory_total_b

    def observe(self, gpu: Sequence[GpuInterval], host: HostInterval | None) -> None:
        """The Recorder's ``on_interval`` hook: add one closed interval of every device."""
        with self._lock:
            for iv in gpu:
                d = self._gpus.setdefault(iv.device_uuid, _Device())
                d.busy_us = add(d.busy_us, units(iv.busy_s, MICRO))
                d.energy_mj = add(d.energy_mj, units(iv.energy_j, MILLI))
                throttle = iv.throttle_s or {}
                for reason in THROTTLE_REASONS:
                    us = units(throttle.get(reason), MICRO)
                    if us is not None:
                        d.throttle_us[reason] = d.throttle_us.get(reason, 0) + us
                d.power_w, d.memory_used_b, d.temperature_c = iv.power_max_w, iv.mem_used_last_b, iv.temp_max_c
            if host is not None:
                self._cpu_us = add(self._cpu_us, units(host.cpu_s, MICRO))

    def snapshot(self) -> list[RunFigures]:
        with self._lock:
            run = self._run
            if run is None:
                return []
            labels = dict(run.labels)
            gpus = sorted((d.figures(uuid) for uuid, d in self._gpus.items()), key=_order)
            return [
                RunFigures(
                    key=RunKey(run.id, labels.get("project", ""), labels.get("team", ""), run.user),
                    name=run.name or "",
                    status=run.status,
                    replayed=run.replayed,
                    started_at=run.started_at,
                    ended_at=run.ended_at,
                    cpu_s=scaled(self._cpu_us, MICRO),
                    gpus=gpus,
                )
            ]


def _order(fig: GpuFigures) -> tuple[int, str]:
    return (fig.index if fig.index is not None else 1 << 30, fig.uuid)
