"""Per-peer waits before connecting again: after a failed dial (short, doubling) and after
frames that broke the rules (long, doubling), forgotten once long past."""

from __future__ import annotations

import time

from engine.backoff import Backoff
from engine.ratelimit import Sweeps


class Pauses:
    """Peers not to connect to before a time that grows with each ``extend``."""

    def __init__(self, first: float, cap: float) -> None:
        self.first, self.cap = first, cap
        self._backoffs: dict[str, Backoff] = {}
        self._until: dict[str, float] = {}
        self._sweeps = Sweeps()

    def left(self, peer_id: str) -> float:
        return max(0.0, self._until.get(peer_id, 0.0) - time.monotonic())

    def extend(self, peer_id: str) -> float:
        now = time.monotonic()
        wait = self._backoffs.setdefault(peer_id, Backoff(self.first, self.cap)).next()
        self._until[peer_id] = now + wait
        if self._sweeps.due(len(self._until)):  # peers long past their pause are forgiven
            for peer in [p for p, until in self._until.items() if now - until > self.cap]:
                self.clear(peer)
            self._sweeps.swept(len(self._until))
        return wait

    def clear(self, peer_id: str) -> None:
        self._backoffs.pop(peer_id, None)
        self._until.pop(peer_id, None)
