"""The governor's loop: observe, decide (policy.py), and tell the engine — about five
times a second, so that input pauses compute within a second."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

import psutil

from engine.aio import finished_within
from engine.governor.idle import IdleDetector, IdleReading
from engine.governor.limits import Limits
from engine.governor.policy import Decision, Observation, decide
from engine.governor.power import PowerSource

log = logging.getLogger(__name__)
INTERVAL = 0.2


class Governable(Protocol):
    def set_running(self, run: bool, reason: str) -> None: ...

    def apply_limits(self, limits: Limits) -> None: ...


class Governor:
    def __init__(self, limits: Limits, idle: IdleDetector | None = None,
                 power: PowerSource | None = None, memory_mb: Callable[[], float] | None = None,
                 clock: Callable[[], datetime] = datetime.now,
                 on_change: Callable[[Decision], None] | None = None) -> None:
        self.limits = limits
        self.idle = idle or IdleDetector()
        self.power = power or PowerSource()
        self._memory_mb = memory_mb or (lambda: psutil.Process().memory_info().rss / 1e6)
        self._clock = clock
        self._on_change = on_change or (lambda decision: None)
        self.decision: Decision | None = None
        self.idle_reading = IdleReading(None, None)
        self.user_paused = False
        self.snoozed_until: datetime | None = None
        self.contribute_now = False
        self._target: Governable | None = None
        self._poke = asyncio.Event()

    # --- what the user asks for -----------------------------------------------------------

    def pause(self) -> None:
        self.user_paused, self.contribute_now = True, False
        self._poke.set()

    def resume(self) -> None:
        """Back to automatic: the limits decide."""
        self.user_paused, self.snoozed_until, self.contribute_now = False, None, False
        self._poke.set()

    def run_now(self) -> None:
        """Compute regardless of idle time and schedule (battery and memory limits stay)."""
        self.user_paused, self.snoozed_until, self.contribute_now = False, None, True
        self._poke.set()

    def snooze(self, until: datetime) -> None:
        self.snoozed_until, self.contribute_now = until, False
        self._poke.set()

    def set_limits(self, limits: Limits) -> None:
        self.limits = limits
        if self._target is not None:
            self._target.apply_limits(limits)
        self._poke.set()

    # --- the loop ---------------------------------------------------------------------------

    async def observe(self) -> Observation:
        reading, previous = await asyncio.to_thread(self.idle.read), self.idle_reading
        first = previous.source is None and not previous.problems
        if reading.source is None and (first or previous.source is not None):
            log.warning(reading.describe)  # once: what each source answered
        self.idle_reading = reading
        return Observation(now=self._clock(), idle_seconds=self.idle_reading.seconds,
                           on_battery=self.power.on_battery(), memory_mb=self._memory_mb(),
                           user_paused=self.user_paused, snoozed_until=self.snoozed_until,
                           contribute_now=self.contribute_now)

    async def step(self) -> Decision:
        decision = decide(await self.observe(), self.limits, self.decision)
        changed = not decision.same(self.decision)
        self.decision = decision
        if changed:
            log.info("%s: %s", "run" if decision.run else "pause", decision.reason)
            if self._target is not None:
                self._target.set_running(decision.run, decision.reason)
            self._on_change(decision)
        return decision

    async def run(self, target: Governable) -> None:
        self._target = target
        target.apply_limits(self.limits)
        while True:
            await self.step()
            self._poke.clear()
            await finished_within(self._poke.wait(), INTERVAL)
