"""Token buckets: how often a key (a peer, an address, a link) may do something.

Pure, with a clock, tested without a network; the backbone limits what peers ask of it
with these, and each link limits the frames its peer sends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Rate:
    per_second: float
    burst: float


class Sweeps:
    """When to sweep stale entries from a table whose keys strangers choose: once it has
    doubled since the last sweep, so the cost per entry added stays constant."""

    def __init__(self, floor: int = 1024) -> None:
        self.floor = floor
        self._next = floor

    def due(self, size: int) -> bool:
        return size > self._next

    def swept(self, size: int) -> None:
        self._next = max(self.floor, 2 * size)


class Buckets:
    """A token bucket per key. Full buckets are forgotten, so idle keys cost nothing."""

    def __init__(self, rate: Rate, clock: Callable[[], float]) -> None:
        self.rate = rate
        self._clock = clock
        self._tokens: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)
        self._sweeps = Sweeps(10_000)

    def take(self, key: str, cost: float = 1.0) -> bool:
        now = self._clock()
        tokens, at = self._tokens.get(key, (self.rate.burst, now))
        tokens = min(self.rate.burst, tokens + (now - at) * self.rate.per_second)
        if tokens < cost:
            self._tokens[key] = (tokens, now)
            return False
        self._tokens[key] = (tokens - cost, now)
        if self._sweeps.due(len(self._tokens)):
            self._forget_full(now)
        return True

    def wait(self, key: str, cost: float = 1.0) -> float:
        """Seconds until ``cost`` could be taken."""
        now = self._clock()
        tokens, at = self._tokens.get(key, (self.rate.burst, now))
        tokens = min(self.rate.burst, tokens + (now - at) * self.rate.per_second)
        return max(cost - tokens, 0.0) / self.rate.per_second if self.rate.per_second else float("inf")

    def _forget_full(self, now: float) -> None:
        full = [k for k, (tokens, at) in self._tokens.items()
                if tokens + (now - at) * self.rate.per_second >= self.rate.burst]
        for key in full:
            del self._tokens[key]
        self._sweeps.swept(len(self._tokens))
