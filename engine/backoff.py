"""Waits between retries that grow, are capped, and are jittered.

After a backbone restarts, every peer reconnects at once; waits that double (up to a cap)
and are spread at random ("equal jitter": half the wait fixed, half random) turn the
stampede into a trickle. A retry is only forgiven once the connection it made has lasted:
one that opens and drops at once keeps backing off.
"""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    def __init__(self, first: float, cap: float, rng: Callable[[], float] = random.random) -> None:
        self.first = first
        self.cap = cap
        self._rng = rng
        self._failures = 0

    def next(self) -> float:
        """The wait before the next attempt; each call doubles the one after (to the cap)."""
        ceiling = min(self.cap, self.first * 2 ** min(self._failures, 60))
        self._failures += 1
        return ceiling / 2 + self._rng() * ceiling / 2

    def reset(self) -> None:
        self._failures = 0

    @property
    def failures(self) -> int:
        return self._failures
