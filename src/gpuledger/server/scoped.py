"""A read-only view of the ledger limited to a reader's projects, for the report code.

Report functions written for the local CLI (run summary, epochs, attempt chains, export) take a
``Ledger``. Handing them a ``ScopedLedger`` instead makes them scope-safe without changing them:
a run outside the scope does not exist (RunNotFound), listings leave it out, and per-run reads of
it come back empty. Writes are not offered. A per-run read method the Ledger gains later (its first
parameter is ``run_id``) is passed through for visible runs and raises RunNotFound for the others;
any other new method is not offered until it is added here with its scoping.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, Metric, RunRecord
from gpuledger.store import Ledger, RunNotFound, server_queries

Scope = frozenset[str] | None
_WRITES = frozenset({"create_run", "add_devices", "append", "update_run", "set_log", "delete_run", "close"})


class ScopedLedger:
    def __init__(self, ledger: Ledger, scope: Scope) -> None:
        self._ledger = ledger
        self.scope = scope
        self._visible: dict[str, bool] = {}

    @property
    def url(self) -> str:
        return self._ledger.url

    @property
    def dialect(self) -> str:
        return self._ledger.dialect

    def visible(self, run_id: str) -> bool:
        if self.scope is None:
            return True
        if run_id not in self._visible:
            found = self._ledger.read(lambda c: server_queries.visible_run(c, run_id, self.scope))
            self._visible[run_id] = found is not None
        return self._visible[run_id]

    def get_run(self, run_id: str) -> RunRecord:
        run = self._ledger.read(lambda c: server_queries.visible_run(c, run_id, self.scope))
        if run is None:
            raise RunNotFound(run_id)
        self._visible[run_id] = True
        return run

    def resolve(self, ref: str) -> str:
        """Full ids only: a prefix search could tell that an invisible run exists."""
        return self.get_run(ref.strip()).id

    def list_runs(
        self,
        project: str | None = None,
        team: str | None = None,
        user: str | None = None,
        status: str | None = None,
        since: float | None = None,
        labels: Mapping[str, Any] | None = None,
        limit: int | None = None,
    ) -> list[RunRecord]:
        return self._ledger.read(
            lambda c: server_queries.list_runs(
                c, self.scope, project=project, team=team, user=user, status=status, since=since, labels=labels,
                limit=limit if limit is not None else 1_000_000,
            )
        )  # fmt: skip

    def devices(self, run_id: str) -> list[GpuIdentity]:
        return self._ledger.devices(run_id) if self.visible(run_id) else []

    def gpu_intervals(self, run_id: str, device_uuid: str | None = None) -> list[GpuInterval]:
        return self._ledger.gpu_intervals(run_id, device_uuid) if self.visible(run_id) else []

    def host_intervals(self, run_id: str) -> list[HostInterval]:
        return self._ledger.host_intervals(run_id) if self.visible(run_id) else []

    def events(self, run_id: str, kind: str | None = None) -> list[Event]:
        return self._ledger.events(run_id, kind) if self.visible(run_id) else []

    def metrics(self, run_id: str, key: str | None = None) -> list[Metric]:
        return self._ledger.metrics(run_id, key) if self.visible(run_id) else []

    def get_log(self, run_id: str) -> bytes | None:
        return self._ledger.get_log(run_id) if self.visible(run_id) else None

    def log_info(self, run_id: str) -> dict[str, Any] | None:
        return self._ledger.log_info(run_id) if self.visible(run_id) else None

    def gpu_totals(self, run_id: str) -> dict[str, dict[str, Any]]:
        return self._ledger.gpu_totals(run_id) if self.visible(run_id) else {}

    def host_totals(self, run_id: str) -> dict[str, Any]:
        return self._ledger.host_totals(run_id) if self.visible(run_id) else self._ledger.host_totals("")

    def last_flush_t(self, run_id: str) -> float | None:
        return self._ledger.last_flush_t(run_id) if self.visible(run_id) else None

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(type(self._ledger), name, None)
        if name.startswith("_") or name in _WRITES or not callable(method):
            raise AttributeError(f"ScopedLedger does not offer {name!r}")
        params = list(inspect.signature(method).parameters)
        if len(params) < 2 or params[1] != "run_id":
            raise AttributeError(f"ScopedLedger does not offer {name!r} (not a per-run read)")
        bound = getattr(self._ledger, name)

        def per_run(run_id: str, *args: Any, **kwargs: Any) -> Any:
            if not self.visible(run_id):
                raise RunNotFound(run_id)
            return bound(run_id, *args, **kwargs)

        return per_run
