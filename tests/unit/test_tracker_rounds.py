"""When a round opens and who is in it: the sample target, silent peers, the status estimate,
and how long joiners downloading the state may hold a round back. A controllable clock."""

import pytest

from engine.wire.control import Progress, Ready, RoundStart, SyncRequest
from tests.unit.tracker_helpers import clock, done, fail_pair, open_round, ready_tracker, sent

__all__ = ["clock"]  # the fixture


def test_a_round_opens_only_when_reported_samples_reach_the_target(clock):
    t = ready_tracker(clock)
    assert not sent(t.handle("a", Progress(0, 60, 10.0)), RoundStart)
    starts = sent(t.handle("b", Progress(0, 40, 10.0)), RoundStart)
    assert sorted(to for to, _ in starts) == ["a", "b"]
    assert starts[0][1].group == ["a", "b"] and starts[0][1].epoch == 0


def test_silent_peers_are_left_out_of_the_next_round(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"))
    t.handle("c", Progress(0, 10, 1.0))
    clock.now += 30  # c goes quiet
    t.handle("a", Progress(0, 50, 10.0))
    ((_, start), *_) = sent(t.handle("b", Progress(0, 50, 10.0)), RoundStart)
    assert start.group == ["a", "b"]


def test_a_peer_still_inside_a_long_micro_batch_stays_in_rounds_while_it_reports(clock):
    t = ready_tracker(clock, peers=("a", "b"))
    for _ in range(3):
        clock.now += 10  # 30 s without a finished micro-batch, but heard from every 10 s
        t.handle("b", Progress(0, 0, 0.0))
    ((_, start), *_) = sent(t.handle("a", Progress(0, 100, 10.0)), RoundStart)
    assert start.group == ["a", "b"]


def test_status_estimates_time_to_the_next_step(clock):
    t = ready_tracker(clock)
    t.handle("a", Progress(0, 40, 10.0))
    t.handle("b", Progress(0, 20, 20.0))
    status = t.status()
    assert (status.samples, status.target, status.peers) == (60, 100, 2)
    assert status.eta_seconds == pytest.approx(40 / 30)


def test_the_next_round_waits_a_bounded_time_for_a_peer_downloading_state(clock):
    t = ready_tracker(clock)
    t.join("c", "c")
    t.handle("c", SyncRequest())
    assert not sent(t.handle("a", Progress(0, 200, 10.0)), RoundStart)
    t.handle("c", Ready(0, "h0"))
    ((_, start), *_) = sent(t.handle("c", Progress(0, 0, 0.0)), RoundStart)
    assert start.group == ["a", "b", "c"]


def test_joiners_that_keep_asking_hold_an_epoch_back_no_longer_than_one_wait(clock):
    """A SyncRequest repeated without end, or one identity after another, held rounds for as
    long as it went on; now an epoch waits for downloads once, and boundedly."""
    t = ready_tracker(clock)
    hold = min(t.join_grace, t.project.round_timeout)
    began = clock.now
    for i in range(int(hold / 3) + 1):
        t.join(f"j{i}", "j")
        t.handle(f"j{i}", SyncRequest())
        assert not sent(t.handle("a", Progress(0, 200, 10.0)), RoundStart)
        clock.now += 3
        t.handle(f"j{i}", SyncRequest())  # and asks again
    assert clock.now - began > hold
    ((_, start), *_) = sent(t.handle("a", Progress(0, 200, 10.0)), RoundStart)
    assert start.group == ["a", "b"]


def test_a_joiner_that_never_finishes_downloading_stops_holding_rounds_back(clock):
    t = ready_tracker(clock)
    t.join("c", "c")
    t.handle("c", SyncRequest())
    assert not sent(t.handle("a", Progress(0, 200, 10.0)), RoundStart)
    clock.now += t.join_grace + 1
    t.handle("b", Progress(0, 0, 0.0))
    ((_, start), *_) = sent(t.handle("a", Progress(0, 200, 10.0)), RoundStart)
    assert start.group == ["a", "b"]


def test_a_download_holds_rounds_back_no_longer_than_a_round_could_take(clock):
    """Its donor may be behind a link that died unnoticed: the others wait at most what a
    failed round would have cost them, even when the join grace is longer."""
    t = ready_tracker(clock)
    t.join_grace = 60.0
    t.join("c", "c")
    t.handle("c", SyncRequest())
    assert not sent(t.handle("a", Progress(0, 200, 10.0)), RoundStart)
    clock.now += t.project.round_timeout - 1
    assert not sent(t.handle("a", Progress(0, 200, 10.0)), RoundStart)
    clock.now += 2
    ((_, start), *_) = sent(t.handle("a", Progress(0, 200, 10.0)), RoundStart)
    assert start.group == ["a", "b"]


def test_rounds_do_not_wait_for_a_download_from_a_peer_the_joiner_cannot_reach(clock):
    t = ready_tracker(clock, peers=("a", "b"))
    start = open_round(t, {"a": 60, "b": 60})
    fail_pair(t, start, "a", "b")  # a's NAT rebound: the two cannot exchange
    clock.now += 2
    t.handle("a", SyncRequest())  # left out; its only donor is b, which it cannot reach
    ((_, start), *_) = sent(t.handle("b", Progress(0, 120, 10.0)), RoundStart)
    assert start.group == ["b"]


def test_identities_that_ask_for_the_state_and_never_download_it_hold_rounds_a_tenth_of_the_time(clock):
    """Ten simulated minutes; every ten seconds a new identity asks where to download the
    state, and never does. Before, each one held the rounds back for a round timeout."""
    t = ready_tracker(clock)
    hold = min(t.join_grace, t.project.round_timeout)
    held = 0
    for second in range(600):
        if second % 10 == 0:
            t.join(f"sybil{second}", "s")
            t.handle(f"sybil{second}", SyncRequest())
        starts = sent(t.handle("a", Progress(t.epoch, 200, 10.0)), RoundStart)
        if starts:
            start = starts[0][1]
            for p in "ab":
                t.handle(p, done(start, f"h{start.epoch + 1}"))
        else:
            held += 1
        clock.now += 1
    assert hold <= held <= 600 / 10 + hold
