"""How long rounds wait for joiners' downloads: a round opened while a joiner downloads
makes its state stale on arrival, but joiners that keep coming (or identities that ask
for the state and never download it) must not stall the rest."""

from __future__ import annotations

import math

# Rounds wait for downloads at most this share of the time. At a tenth, a 45 s window of
# such asking held two waits and cost 13-21% (CI, 2026-11-24).
HOLD_SHARE = 1 / 20


class JoinHold:
    """A bucket of waiting time: it fills at HOLD_SHARE of the clock, up to one whole wait
    (a round's timeout, or the join grace if shorter), and a wait drains it for as long as
    it lasts. Before, each wait cost a whole wait's budget however short: the honest
    peers' joins at a collaboration's start (a fifth of a second) left none for a minute,
    and a joiner behind rounds ten a second apart chased them for good, each download an
    epoch late."""

    def __init__(self) -> None:
        self._left = math.inf  # seconds of waiting it may still cost (full at first)
        self._at: float | None = None  # when last asked
        self._holding = False

    def holds(self, now: float, wanted: bool, longest: float) -> bool:
        """Whether rounds wait now, if a download ``wanted`` it; each wait at most ``longest``."""
        elapsed = max(now - self._at, 0.0) if self._at is not None else 0.0
        self._at = now
        # (A hold lasts one wait at most: unasked meanwhile -- rounds not due for other
        # reasons -- it is not charged for the hours until the next question.)
        spent = min(elapsed, longest) if self._holding else 0.0
        self._left = min(self._left - spent + elapsed * HOLD_SHARE, longest)
        self._holding = wanted and self._left > 0
        return self._holding
