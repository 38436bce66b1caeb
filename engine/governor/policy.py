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

MEMORY_RESUME = 0.9
POWER_SETTLE = timedelta(seconds=15)


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
    code: str  # running, paused, snoozed, battery, schedule, memory, waiting_idle, idle_unknown
    reason: str
    since: datetime

    def same(self, other: Decision | None) -> bool:
        return other is not None and (self.run, self.code, self.reason) == (
            other.run, other.code, other.reason)


def decide(obs: Observation, limits: Limits, previous: Decision | None = None) -> Decision:
    """What the engine may do now; ``previous`` supplies the hysteresis."""
    run, code, reason = _judge(obs, limits, previous)
    since = previous.since if previous is not None and (previous.run, previous.code) == (run, code) \
        else obs.now
    return Decision(run, code, reason, since)


def _judge(obs: Observation, limits: Limits, previous: Decision | None) -> tuple[bool, str, str]:
    if obs.user_paused:
        return False, "paused", "Paused by you"
    if obs.snoozed_until is not None and obs.now < obs.snoozed_until:
        return False, "snoozed", f"Snoozed until {obs.snoozed_until:%H:%M}"
    if not limits.run_on_battery:
        if obs.on_battery:
            return False, "battery", "Paused on battery"
        if previous is not None and previous.code == "battery" and obs.now - previous.since < POWER_SETTLE:
            return False, "battery", "Paused on battery"
    if limits.max_memory_mb is not None:
        cap = limits.max_memory_mb
        threshold = cap * MEMORY_RESUME if previous is not None and previous.code == "memory" else cap
        if obs.memory_mb > threshold:
            return False, "memory", f"Using {obs.memory_mb:.0f} MB, more than your limit of {cap} MB"
    if obs.contribute_now:
        return True, "running", "Contributing (you asked to)"
    schedule = limits.weekly
    if not schedule.allows(obs.now):
        when = schedule.next_change(obs.now)
        suffix = f" (resumes {_when(when, obs.now)})" if when else ""
        return False, "schedule", f"Outside the schedule{suffix}"
    if limits.only_when_idle:
        if obs.idle_seconds is None:
            return False, "idle_unknown", "Idle detection is unavailable on this computer"
        needed = limits.idle_minutes * 60
        if obs.idle_seconds < needed:
            return False, "waiting_idle", "Waiting for the computer to be idle"
    return True, "running", "Contributing"


def _when(moment: datetime, now: datetime) -> str:
    if moment.date() == now.date():
        return f"at {moment:%H:%M}"
    return f"{moment:%A} at {moment:%H:%M}"
