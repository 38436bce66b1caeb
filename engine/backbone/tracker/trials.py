"""Trial rounds: an auxiliary peer that has not proven itself yet (no round it reduced in
has settled) is everyone's to wait for as any reducer is, so only one such peer at a time
gets a trial round, and trials are kept short and rare.

Rare: after a trial that lasted d seconds, the next comes (TRIAL_SPACING - 1) * d later,
twice that after a trial that failed, four times after two in a row... so identities that
come as auxiliary peers and stall their trials cost the collaboration at most a tenth of
its time, however many there are, and ever less.

Short: a trial round's timeout is TRIAL_TIMEOUT_FACTOR times what the collaboration's
settled rounds lately took (the backbone's own clock, not anyone's claim), at least
MIN_TRIAL_TIMEOUT and at most the project's round timeout. A withholding stranger stalls
a round of 50 ms for a second, not for the project's whole timeout; an honest one reduces
as fast as the members it joins."""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable

TRIAL_SPACING = 10
MAX_TRIAL_BACKOFF = 6
TRIAL_TIMEOUT_FACTOR = 10
MIN_TRIAL_TIMEOUT = 1.0
RECENT_ROUNDS = 20  # settled rounds whose median time sets a trial's timeout


class Trials:
    def __init__(self, clock: Callable[[], float], retry_delay: float) -> None:
        self._clock = clock
        self.retry_delay = retry_delay
        self._next = -math.inf  # no unproven auxiliary peer in a round before then
        self._failed = 0  # trial rounds in a row that did not settle
        self._settled: deque[float] = deque(maxlen=RECENT_ROUNDS)  # seconds each took

    def due(self, now: float) -> bool:
        return now >= self._next

    def opened(self) -> None:
        self._next = math.inf  # until this one is over

    def timeout(self, round_timeout: float) -> float:
        """How long a trial round may take before it fails."""
        if not self._settled:
            return round_timeout  # nothing seen yet to judge by
        typical = statistics.median(self._settled)
        return min(round_timeout, max(MIN_TRIAL_TIMEOUT, TRIAL_TIMEOUT_FACTOR * typical))

    def round_over(self, opened_at: float, settled_at: float | None, trial: bool) -> None:
        """A round is over (``settled_at`` None: it failed). A settled round that was no
        trial tells how long rounds take; a trial sets when the next may come."""
        if not trial:
            if settled_at is not None:
                self._settled.append(settled_at - opened_at)
            return
        now = self._clock()
        took = now - opened_at
        if settled_at is None:
            took += self.retry_delay
            self._failed += 1
        else:
            self._failed = 0
        backoff = 2 ** min(self._failed, MAX_TRIAL_BACKOFF)
        self._next = now + (TRIAL_SPACING - 1) * took * backoff
