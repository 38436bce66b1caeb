"""The governor's decisions, as a table of cases."""

from datetime import datetime, timedelta

import pytest

from engine.governor.limits import Limits
from engine.governor.policy import POWER_SETTLE, Decision, GovernorState, Observation, decide
from engine.governor.weekly_hours import WeeklySchedule

MONDAY_NOON = datetime(2026, 11, 23, 12, 0)  # a Monday


def obs(**kw):
    base = dict(now=MONDAY_NOON, idle_seconds=1000.0, on_battery=False, memory_mb=500.0)
    return Observation(**{**base, **kw})


@pytest.mark.parametrize(
    "limits, observation, run, reason",
    [
        (Limits(), obs(), True, "Contributing"),
        (Limits(only_when_idle=True, idle_minutes=5), obs(idle_seconds=299), False,
         "Waiting for the computer to be idle"),
        (Limits(only_when_idle=True, idle_minutes=5), obs(idle_seconds=300), True, "Contributing"),
        (Limits(only_when_idle=True), obs(idle_seconds=None), False,
         "Idle detection is unavailable on this computer"),
        (Limits(), obs(idle_seconds=None), True, "Contributing"),
        (Limits(run_on_battery=False), obs(on_battery=True), False, "Paused on battery"),
        (Limits(run_on_battery=True), obs(on_battery=True), True, "Contributing"),
        (Limits(run_on_battery=False), obs(on_battery=None), True, "Contributing"),
        (Limits(), obs(user_paused=True), False, "Paused by you"),
        (Limits(), obs(snoozed_until=MONDAY_NOON + timedelta(hours=2, minutes=30)), False,
         "Snoozed until 14:30"),
        (Limits(), obs(snoozed_until=MONDAY_NOON - timedelta(seconds=1)), True, "Contributing"),
        (Limits(max_memory_mb=1000), obs(memory_mb=1200), False,
         "Using 1200 MB, more than your limit of 1000 MB"),
        (Limits(schedule="mon-fri 18:00-08:00"), obs(), False, "Outside the schedule (resumes at 18:00)"),
        (Limits(schedule="weekends"), obs(), False, "Outside the schedule (resumes Saturday at 00:00)"),
        (Limits(schedule="mon-fri 18:00-08:00"), obs(now=MONDAY_NOON.replace(hour=18)), True, "Contributing"),
        (Limits(schedule="mon-fri 18:00-08:00"),  # Monday evening runs into Tuesday morning
         obs(now=MONDAY_NOON.replace(day=24, hour=7, minute=59)), True, "Contributing"),
        (Limits(schedule="mon-fri 18:00-08:00"), obs(now=MONDAY_NOON.replace(hour=7, minute=59)), False,
         "Outside the schedule (resumes at 18:00)"),
        (Limits(schedule="mon-fri 18:00-08:00"), obs(now=MONDAY_NOON.replace(hour=8)), False,
         "Outside the schedule (resumes at 18:00)"),
        (Limits(only_when_idle=True, schedule="weekends"), obs(contribute_now=True, idle_seconds=0), True,
         "Contributing (you asked to)"),
        (Limits(run_on_battery=False), obs(contribute_now=True, on_battery=True), False, "Paused on battery"),
        (Limits(), obs(user_paused=True, snoozed_until=MONDAY_NOON + timedelta(hours=1)), False,
         "Paused by you"),
    ],
)
def test_decisions(limits, observation, run, reason):
    decision = decide(observation, limits)
    assert (decision.run, decision.reason) == (run, reason)


def test_memory_must_fall_well_below_the_cap_before_work_resumes():
    limits = Limits(max_memory_mb=1000)
    paused = decide(obs(memory_mb=1100), limits)
    assert not decide(obs(memory_mb=950), limits, paused).run  # under the cap, above 90%
    assert decide(obs(memory_mb=850), limits, paused).run
    assert decide(obs(memory_mb=950), limits).run  # without having paused, 950 is fine


def test_power_must_stay_on_the_charger_before_work_resumes():
    limits = Limits(run_on_battery=False)
    unplugged = decide(obs(on_battery=True), limits)
    replugged = obs(on_battery=False, now=MONDAY_NOON + timedelta(seconds=5))
    assert not decide(replugged, limits, unplugged).run
    settled = obs(on_battery=False, now=MONDAY_NOON + POWER_SETTLE + timedelta(seconds=1))
    assert decide(settled, limits, unplugged).run


def test_a_decision_remembers_since_when_it_holds():
    first = decide(obs(), Limits())
    later = decide(obs(now=MONDAY_NOON + timedelta(minutes=3)), Limits(), first)
    assert later.since == first.since and later.same(first)
    assert not Decision(False, GovernorState.PAUSED, "Paused by you", MONDAY_NOON).same(later)


@pytest.mark.parametrize(
    "text, when, allowed",
    [
        ("always", MONDAY_NOON, True),
        ("mon-fri 09:00-17:00", MONDAY_NOON, True),
        ("mon-fri 09:00-17:00", MONDAY_NOON.replace(hour=17), False),
        ("sun 22:00-02:00", MONDAY_NOON.replace(hour=1, minute=59), True),  # past midnight, into Monday
        ("sun 22:00-02:00", MONDAY_NOON.replace(hour=2), False),
        ("weekdays 00:00-24:00, sat 10:00-11:00", datetime(2026, 11, 28, 10, 30), True),
        ("daily 23:00-01:00", datetime(2026, 11, 29, 23, 59), True),
    ],
)
def test_schedule_edges(text, when, allowed):
    assert WeeklySchedule.parse(text).allows(when) is allowed


@pytest.mark.parametrize("bad", ["someday", "mon 9-17", "mon 25:00-26:00", "fri-xyz 10:00-12:00"])
def test_bad_schedules_name_the_problem(bad):
    with pytest.raises(ValueError):
        Limits(schedule=bad)


@pytest.mark.parametrize("bad", [dict(cpu_percent=0), dict(cpu_percent=101), dict(threads=0),
                                 dict(max_memory_mb=1), dict(max_upload_kbps=0), dict(idle_minutes=-1)])
def test_bad_limits_are_refused(bad):
    field = next(iter(bad))
    with pytest.raises(ValueError, match=field):
        Limits.checked(**bad)


def test_limits_survive_serialisation():
    limits = Limits(threads=2, cpu_percent=50, max_upload_kbps=2000, only_when_idle=True,
                    idle_minutes=2.5, schedule="mon-fri 18:00-08:00")
    assert Limits.from_json(limits.to_json()) == limits
