"""When to compute: a pure function from what is observed to Run or Pause(reason).

Reasons are sentences a person understands. Hysteresis keeps decisions from flapping:
idle time restarts at zero on input, so "idle for N minutes" cannot flicker; memory must
fall below 90% of the cap before work resumes; power must stay on the charger for
``POWER_SETTLE`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from engine.governor.limits import Limits
from engine.wire.types import StrEnum

MEMORY_RESUME = 0.9
POWER_SETTLE = timedelta(seconds=15)


class GovernorState(StrEnum):
    """Why the engine computes or not: one name per situation, shared by the governor, the
    worker protocol and the app's tray."""

    RUNNING = "running"
    PAUSED = "paused"  # the user paused
    SNOOZED = "snoozed"  # the user paused until a time
    BATTERY = "battery"
    SCHEDULE = "schedule"
    MEMORY = "memory"
    WAITING_IDLE = "waiting_idle"  # only when idle, and the computer is in use
    IDLE_UNKNOWN = "idle_unknown"  # only when idle, and idle time cannot be measured here

    @property
    def chosen_by_user(self) -> bool:
        """What the tray's Resume undoes."""
        return self in (GovernorState.PAUSED, GovernorState.SNOOZED)

    @property
    def waiting(self) -> bool:
        """Paused until the computer is left alone, not for a problem."""
        return self in (GovernorState.WAITING_IDLE, GovernorState.IDLE_UNKNOWN)


@dataclass(frozen=True)
class Observation:
    now: datetime  # local time
    idle_seconds: float | None  # None: idle time cannot be measured here
    on_battery: bool | None  # None: unknown (no battery means False)
    memory_mb: float
    user_paused: bool = False
    snoozed_until: datetime | None = None
    contribute_now: bool = False  # the user asked to compute regardless of idle and schedule


@dataclass(frozen=True)
class Decision:
    run: bool
    state: GovernorState
    reason: str
    since: datetime

    def same(self, other: Decision | None) -> bool:
        return other is not None and (self.run, self.state, self.reason) == (
            other.run, other.state, other.reason)


def decide(obs: Observation, limits: Limits, previous: Decision | None = None) -> Decision:
    """What the engine may do now; ``previous`` supplies the hysteresis."""
    state, reason = _judge(obs, limits, previous)
    run = state is GovernorState.RUNNING
    since = previous.since if previous is not None and previous.state is state else obs.now
    return Decision(run, state, reason, since)


def _judge(obs: Observation, limits: Limits, previous: Decision | None) -> tuple[GovernorState, str]:
    was = previous.state if previous is not None else None
    if obs.user_paused:
        return GovernorState.PAUSED, "Paused by you"
    if obs.snoozed_until is not None and obs.now < obs.snoozed_until:
        return GovernorState.SNOOZED, f"Snoozed until {obs.snoozed_until:%H:%M}"
    if not limits.run_on_battery:
        if obs.on_battery:
            return GovernorState.BATTERY, "Paused on battery"
        if previous is not None and was is GovernorState.BATTERY and obs.now - previous.since < POWER_SETTLE:
            return GovernorState.BATTERY, "Paused on battery"
    if limits.max_memory_mb is not None:
        cap = limits.max_memory_mb
        threshold = cap * MEMORY_RESUME if was is GovernorState.MEMORY else cap
        if obs.memory_mb > threshold:
            return GovernorState.MEMORY, f"Using {obs.memory_mb:.0f} MB, more than your limit of {cap} MB"
    if obs.contribute_now:
        return GovernorState.RUNNING, "Contributing (you asked to)"
    schedule = limits.weekly
    if not schedule.allows(obs.now):
        when = schedule.next_change(obs.now)
        suffix = f" (resumes {_when(when, obs.now)})" if when else ""
        return GovernorState.SCHEDULE, f"Outside the schedule{suffix}"
    if limits.only_when_idle:
        if obs.idle_seconds is None:
            return GovernorState.IDLE_UNKNOWN, "Idle detection is unavailable on this computer"
        needed = limits.idle_minutes * 60
        if obs.idle_seconds < needed:
            return GovernorState.WAITING_IDLE, "Waiting for the computer to be idle"
    return GovernorState.RUNNING, "Contributing"


def _when(moment: datetime, now: datetime) -> str:
    if moment.date() == now.date():
        return f"at {moment:%H:%M}"
    return f"{moment:%A} at {moment:%H:%M}"
