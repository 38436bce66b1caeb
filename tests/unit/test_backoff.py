"""Waits between retries: doubling to a cap, spread at random, forgiven on request."""

import random

from engine.backoff import Backoff


def test_waits_double_up_to_the_cap_and_keep_at_least_half_of_each():
    waits = [Backoff(1.0, 30.0, rng=lambda: 0.0).next()]
    backoff_low, backoff_high = Backoff(1.0, 30.0, rng=lambda: 0.0), Backoff(1.0, 30.0, rng=lambda: 1.0)
    low = [backoff_low.next() for _ in range(8)]
    high = [backoff_high.next() for _ in range(8)]
    assert waits == [0.5]
    assert low == [0.5, 1, 2, 4, 8, 15, 15, 15]
    assert high == [1, 2, 4, 8, 16, 30, 30, 30]


def test_fifty_peers_reconnecting_at_once_spread_over_the_window():
    rng = random.Random(7)
    firsts = sorted(Backoff(1.0, 60.0, rng=rng.random).next() for _ in range(50))
    assert firsts[0] >= 0.5 and firsts[-1] <= 1.0
    assert firsts[-1] - firsts[0] > 0.4  # not all at the same instant


def test_a_reset_starts_over():
    backoff = Backoff(1.0, 60.0, rng=lambda: 1.0)
    for _ in range(5):
        backoff.next()
    backoff.reset()
    assert backoff.next() == 1.0 and backoff.failures == 1
