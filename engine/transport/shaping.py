"""Bandwidth caps: token buckets that sends wait on. The rate can change at any time."""

from __future__ import annotations

import asyncio
import time

BURST_SECONDS = 0.05


class RateLimiter:
    """At most ``rate`` bytes per second on average (None: unlimited)."""

    def __init__(self, rate: float | None = None) -> None:
        self._rate = rate
        self._tokens = 0.0
        self._stamp = time.monotonic()
        self._lock = asyncio.Lock()

    @property
    def rate(self) -> float | None:
        return self._rate

    def set_rate(self, rate: float | None) -> None:
        self._refill()
        self._rate = rate

    async def acquire(self, size: int) -> None:
        if self._rate is None:
            return
        async with self._lock:  # first come, first served
            while True:
                rate = self._rate
                if rate is None:
                    return
                self._refill()
                if self._tokens >= size or self._tokens >= self._burst(rate):
                    self._tokens -= size  # may go negative: a big chunk borrows from the future
                    return
                await asyncio.sleep(min((min(size, self._burst(rate)) - self._tokens) / rate, 0.25))

    def _burst(self, rate: float) -> float:
        return rate * BURST_SECONDS

    def _refill(self) -> None:
        now = time.monotonic()
        if self._rate is not None:
            self._tokens = min(self._tokens + (now - self._stamp) * self._rate, self._burst(self._rate))
        self._stamp = now
