"""Samples per second over a sliding window of wall-clock time. Micro-batches add to it on
the compute thread while reports read it on the event loop (and on the compute thread):
a lock keeps the running sum and the window together. The sum is kept, not recounted: a
report due is checked after every micro-batch, and summing a window of thousands of small
micro-batches each time cost 2% of digits' compute."""

from __future__ import annotations

import threading
import time
from collections import deque


class Throughput:
    def __init__(self, window: float = 30.0, clock=time.monotonic) -> None:
        self.window = window
        self._clock = clock
        self._events: deque[tuple[float, int]] = deque()
        self._start = clock()
        self._lock = threading.Lock()
        self._total = 0  # the samples of the events in the window

    def add(self, samples: int) -> None:
        with self._lock:
            self._events.append((self._clock(), samples))
            self._total += samples
            self._trim()

    def rate(self) -> float:
        with self._lock:
            self._trim()
            if not self._events:
                return 0.0
            now = self._clock()
            span = max(now - max(self._start, now - self.window), 1e-3)
            return self._total / span

    def _trim(self) -> None:
        horizon = self._clock() - self.window
        while self._events and self._events[0][0] < horizon:
            self._total -= self._events.popleft()[1]
