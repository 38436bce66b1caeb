"""Who hears the counts when the target is near. A peer far from the target reports every
half second; the first ask of an epoch says the target is near, and a peer that stays
silent until its own estimate says so computes on unseen: both digits peers of a test
went 6-12 micro-batches past their shares that way. Told the counts at once, it asks too,
and every count the answers carry is fresh."""

from __future__ import annotations

from collections.abc import Mapping

from engine.backbone.tracker.membership import PeerState

# A count reported this recently is fresh: its peer needs no word.
FRESH = 0.02


class Nudges:
    """Each counted peer is told at most once an epoch (a status to all costs what one
    broadcast does), and only on the ask of a peer that counts (a newcomer's or a
    stranger's ask moves nobody)."""

    def __init__(self) -> None:
        self._epoch = -1
        self._told: set[str] = set()

    def due(self, epoch: int, asker: str, counted: Mapping[str, PeerState], now: float) -> list[str]:
        if epoch != self._epoch:
            self._epoch, self._told = epoch, set()
        if asker not in counted:
            return []
        due = [p.peer_id for p in counted.values() if p.peer_id != asker and p.peer_id not in self._told
               and now - p.reported_at >= FRESH]
        self._told.update(due)
        return due
