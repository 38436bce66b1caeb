"""How long rounds wait for joiners' downloads (engine/backbone/tracker/join_hold.py)."""

from engine.backbone.tracker.join_hold import HOLD_SHARE, JoinHold

LONGEST = 3.0  # a round's timeout


def held(hold: JoinHold, start: float, seconds: float, step: float = 0.01) -> float:
    """Seconds of ``seconds`` from ``start`` that rounds waited, a download wanting it all along."""
    waited, now = 0.0, start
    while now < start + seconds:
        waited += step if hold.holds(now, True, LONGEST) else 0.0
        now += step
    hold.holds(now, False, LONGEST)
    return waited


def test_a_short_wait_leaves_the_next_joiner_its_wait():
    """Before, the honest peers' joins at a collaboration's start (a fifth of a second)
    spent the whole budget for a minute, and a joiner three seconds later chased rounds
    ten a second apart for good."""
    hold = JoinHold()
    assert held(hold, 0.0, 0.2) >= 0.19
    assert hold.holds(3.0, False, LONGEST) is False
    assert held(hold, 3.0, 2.5) >= 2.4


def test_downloads_without_end_hold_rounds_a_twentieth_of_the_time():
    hold = JoinHold()
    waited = held(hold, 0.0, 120.0)
    assert waited <= LONGEST + HOLD_SHARE * 120.0 + 0.1
    assert waited >= HOLD_SHARE * 120.0 - 0.5, "each joiner still gets its waits"
    assert not hold.holds(130.0, False, LONGEST)


def test_a_hold_left_unasked_for_an_hour_costs_one_wait_not_the_hour():
    """Rounds stop being due while a hold is on (a peer paused, the samples fell short):
    charged for the whole gap, the bucket held no wait for the next nineteen hours."""
    hold = JoinHold()
    assert hold.holds(0.0, True, LONGEST)
    assert not hold.holds(3600.0, False, LONGEST)
    assert held(hold, 3601.0, 2.5) >= 2.4
