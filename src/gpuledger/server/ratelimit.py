"""Token buckets per key (a token id, a client address): ``take`` says whether a request may go on,
and if not, how long until it may (the 429's Retry-After).

Each key's bucket holds up to ``burst`` requests and refills at ``per_s``; ``per_s <= 0`` turns
the limiter off. Buckets live in one process (each replica limits on its own) in an LRU of at most
``max_keys``: a flood of new keys (addresses) evicts the longest-idle buckets, which are full anyway
or close to it, so memory stays bounded.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

MAX_KEYS = 65536


class RateLimiter:
    def __init__(
        self, per_s: float, burst: float, *, max_keys: int = MAX_KEYS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_s = per_s
        self.burst = max(1.0, burst)
        self._max_keys = max_keys
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)

    @property
    def enabled(self) -> bool:
        return self.per_s > 0

    def take(self, key: str) -> float:
        """0 when the request may go on (one token taken), else the seconds until one is there."""
        if not self.enabled:
            return 0.0
        now = self._clock()
        tokens, at = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.per_s)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            wait = 0.0
        else:
            self._buckets[key] = (tokens, now)
            wait = (1.0 - tokens) / self.per_s
        while len(self._buckets) > self._max_keys:
            self._buckets.popitem(last=False)
        return wait
