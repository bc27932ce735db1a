"""The platform adapters, each polled in its own thread so none can stall the agent or another.

An adapter module (``gpuledger.node.docker``, ``.kubelet``, ``.slurm``) offers
``open_source(options: SourceOptions) -> ClaimSource`` (node/claims.py). The agent opens each one
named on its command line inside that source's poller thread (opening may block on a socket) and
then asks it for ``claims(now)`` every ``period_s``. The agent's loop only ever reads the latest
snapshot: a source that is slow or hangs leaves its last claims in place and its status says for
how long it has not answered; one that raises, despite the contract, is caught, reported and
asked again; a module that is not installed is reported once and never polled.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuledger.node.claims import Claims, ClaimSource, SourceOptions

ADAPTERS: dict[str, str] = {
    "docker": "gpuledger.node.docker",
    "kubelet": "gpuledger.node.kubelet",
    "slurm": "gpuledger.node.slurm",
}
STALE_AFTER_S = 30.0  # a source silent this long is reported as not answering


@dataclass(frozen=True)
class SourceState:
    name: str
    status: str | None  # None: fully working
    up: bool  # answered within STALE_AFTER_S
    answered_at: float | None
    # The adapter's own word (its ``blind()``): it cannot see its platform at all. None: an adapter
    # without that method, for which any status means it cannot.
    blind: bool | None = None

    @property
    def sees(self) -> bool:
        """It answers and can see its platform: the start report's ``ok`` and ``source_up`` 1."""
        if not self.up:
            return False
        return not self.blind if self.blind is not None else self.status is None


class SourcePoller:
    """One adapter in one daemon thread; ``snapshot()`` is what it last said."""

    def __init__(
        self,
        name: str,
        opener: Callable[[], ClaimSource],
        *,
        period_s: float = 2.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._opener = opener
        self._period_s = period_s
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._claims = Claims()
        self._status: str | None = "no answer yet"
        self._answered: float | None = None
        self._answered_mono: float | None = None
        self._blind: bool | None = None
        self._source: ClaimSource | None = None
        self._stop = threading.Event()
        self.version = 0  # bumped whenever the claims change
        self._thread = threading.Thread(target=self._loop, name=f"gpuledger-source-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def snapshot(self) -> tuple[Claims, int]:
        with self._lock:
            return self._claims, self.version

    @property
    def opened(self) -> ClaimSource | None:
        with self._lock:
            return self._source

    def state(self) -> SourceState:
        with self._lock:
            status, answered, mono, blind = self._status, self._answered, self._answered_mono, self._blind
        up = mono is not None and self._monotonic() - mono < max(STALE_AFTER_S, 3 * self._period_s)
        if mono is not None and not up:
            silent = self._monotonic() - mono
            status = f"no answer for {silent:.0f} s (keeping its last claims)" + (f"; {status}" if status else "")
        return SourceState(self.name, status, up, answered, blind)

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self._period_s)
        source = self._source
        if source is not None:
            with contextlib.suppress(Exception):  # closing a dead platform connection: nothing left to do
                source.close()

    def poll_once(self) -> None:
        try:
            if self._source is None:
                self._source = self._opener()
            claims = self._source.claims(self._clock())
            status = self._source.status()
            blind_of = getattr(self._source, "blind", None)
            blind = bool(blind_of()) if callable(blind_of) else None
        except Exception as exc:  # the contract says never; a bug in one adapter must not spread
            with self._lock:
                self._status = f"failed: {type(exc).__name__}: {exc}"
            return
        with self._lock:
            if claims != self._claims:
                self._claims = claims
                self.version += 1
            self._status, self._blind = status, blind
            self._answered, self._answered_mono = self._clock(), self._monotonic()


class Sources:
    """Every poller; ``claims()`` merges their snapshots (cached until one of them changes)."""

    def __init__(self, pollers: list[SourcePoller], missing: dict[str, str] | None = None) -> None:
        self.pollers = pollers
        self.missing = dict(missing or {})  # name -> why it could not be loaded
        self._merged = Claims()
        self._versions: tuple[int, ...] = ()

    def start(self) -> None:
        for p in self.pollers:
            p.start()

    def claims(self) -> tuple[Claims, tuple[int, ...]]:
        snaps = [p.snapshot() for p in self.pollers]
        versions = tuple(v for _, v in snaps)
        if versions != self._versions:
            merged = Claims()
            for claims, _ in snaps:
                merged = merged.merge(claims)
            self._merged, self._versions = merged, versions
        return self._merged, versions

    def source(self, name: str) -> ClaimSource | None:
        """The adapter ``name`` once opened (for what claims cannot carry, e.g. a container's log)."""
        for p in self.pollers:
            if p.name == name:
                return p.opened
        return None

    def states(self) -> list[SourceState]:
        out = [p.state() for p in self.pollers]
        out += [SourceState(name, why, False, None) for name, why in sorted(self.missing.items())]
        return out

    def stop(self) -> None:
        for p in self.pollers:
            p.stop()


def load_sources(wanted: list[str], options: SourceOptions, *, period_s: float = 2.0) -> Sources:
    """Pollers for the adapters named in ``wanted``; a module that cannot be imported is reported."""
    pollers: list[SourcePoller] = []
    missing: dict[str, str] = {}
    for name in wanted:
        module_name = ADAPTERS[name]
        try:
            module = importlib.import_module(module_name)
            opener = module.open_source
        except ImportError as exc:
            missing[name] = f"adapter not available ({exc})"
            continue
        except AttributeError:
            missing[name] = f"{module_name} has no open_source(options)"
            continue
        pollers.append(SourcePoller(name, lambda o=opener: o(options), period_s=period_s))
    return Sources(pollers, missing)
