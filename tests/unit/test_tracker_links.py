"""The links between peers: pairs that cannot connect are kept apart, relayed peers reduce
nothing, and shares follow the reported links. No network, a controllable clock."""

import pytest

from engine.planning.load_balancing import Member, balance, round_time
from engine.wire.control import Progress, Ready, Resync, RoundStart, SyncPlan, SyncRequest
from tests.unit.tracker_helpers import MBIT, clock, done, fail_pair, open_round, ready_tracker, sent

__all__ = ["clock"]  # the fixture


def test_a_pair_that_cannot_connect_is_kept_apart_with_growing_backoff(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"), target_batch_size=90)
    start = open_round(t, {"a": 40, "b": 40, "c": 40})
    assert start.group == ["a", "b", "c"]
    fail_pair(t, start, "b", "c")
    t.handle("a", done(start, ok=False, error="timeout"))
    clock.now += 2
    start = open_round(t, {"a": 50, "b": 50, "c": 30})
    assert start.group == ["a", "b"], "b and c were put in one round again at once"
    t.handle("a", done(start))
    t.handle("b", done(start))

    clock.now += 31  # the first cooldown is over: they are tried together again, and fail
    for p in "abc":
        t.handle(p, SyncRequest())
        t.handle(p, Ready(1, "h1"))
    start = open_round(t, {"a": 50, "b": 50, "c": 40})
    assert start.group == ["a", "b", "c"]
    fail_pair(t, start, "b", "c")
    t.handle("a", done(start, ok=False, error="timeout"))
    clock.now += 31  # the second failure doubled the wait
    start = open_round(t, {"a": 50, "b": 50, "c": 30})
    assert start.group == ["a", "b"]


def test_a_peer_cut_off_from_the_others_never_outranks_them_however_much_it_computed(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"), target_batch_size=90)
    start = open_round(t, {"a": 40, "b": 40, "c": 40})
    fail_pair(t, start, "a", "b")  # a's NAT rebound: it reaches neither b nor c
    fail_pair(t, start, "a", "c")
    clock.now += 2
    start = open_round(t, {"a": 500, "b": 50, "c": 50})
    assert start.group == ["b", "c"]


def test_a_peer_resyncs_from_a_donor_it_can_reach(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"), target_batch_size=90)
    start = open_round(t, {"a": 40, "b": 40, "c": 40})
    fail_pair(t, start, "a", "c")
    t.handle("b", done(start, ok=False, error="timeout"))
    ((_, plan),) = sent(t.handle("c", SyncRequest()), SyncPlan)
    assert plan.peer == "b"


def test_after_the_cooldown_a_donor_that_failed_the_peer_is_still_asked_last(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"), target_batch_size=90)
    start = open_round(t, {"a": 40, "b": 40, "c": 40})
    fail_pair(t, start, "a", "c")
    t.handle("b", done(start, ok=False, error="timeout"))
    clock.now += 31  # kept apart no longer, but nothing says their path works again
    for p in "ab":
        t.handle(p, Progress(0, 10, 1.0))
    ((_, plan),) = sent(t.handle("c", SyncRequest()), SyncPlan)
    assert plan.peer == "b"


def test_a_left_out_peer_waits_for_a_donor_it_can_reach_rather_than_ask_one_it_cannot(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"), target_batch_size=90)
    start = open_round(t, {"a": 40, "b": 40, "c": 40})
    fail_pair(t, start, "b", "c")
    t.handle("a", done(start, ok=False, error="timeout"))
    clock.now += 2
    start = open_round(t, {"a": 50, "b": 50, "c": 30})
    assert start.group == ["a", "b"]
    t.leave("a")  # crashed before reporting
    outs = t.handle("b", done(start))  # b steps and, alone in the round now, settles it
    assert ("c" in [to for to, _ in sent(outs, Resync)])
    assert t.epoch == 1


def test_a_peer_reachable_only_through_a_relay_is_given_nothing_to_reduce(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"), target_batch_size=90)
    t.handle("b", Progress(0, 30, 10.0, client_mode=True))
    start = open_round(t, {"a": 30, "c": 30})
    assert start.group == ["a", "b", "c"]
    assert start.shares[start.group.index("b")] == 0
    assert all(share > 0 for peer, share in zip(start.group, start.shares, strict=True) if peer != "b")


def test_when_every_peer_is_relayed_they_all_reduce(clock):
    t = ready_tracker(clock, peers=("a", "b"))
    t.handle("a", Progress(0, 50, 10.0, client_mode=True))
    start = sent(t.handle("b", Progress(0, 50, 10.0, client_mode=True)), RoundStart)[0][1]
    assert all(share > 0 for share in start.shares)


def test_shares_follow_the_links_the_members_report(clock):
    """40/40, 20/5 and 10/2 Mbit/s and a relayed peer: the LP, not equal thirds."""
    t = ready_tracker(clock, peers=("a", "b", "c", "d"), target_batch_size=100)
    t.handle("d", Progress(0, 25, 10.0, client_mode=True, upload=40 * MBIT, download=40 * MBIT))
    t.handle("b", Progress(0, 25, 10.0, upload=5 * MBIT, download=20 * MBIT))
    t.handle("c", Progress(0, 25, 10.0, upload=2 * MBIT, download=10 * MBIT))
    start = sent(t.handle("a", Progress(0, 25, 10.0, upload=40 * MBIT, download=40 * MBIT)), RoundStart)[0][1]
    share = dict(zip(start.group, start.shares, strict=True))
    assert share["d"] == 0 and share["c"] == 0  # relayed; and the thinnest uplink reduces nothing
    assert share["a"] > share["b"] > 0 and sum(start.shares) == pytest.approx(1)


def test_a_link_claimed_near_zero_still_lets_the_round_open(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"), target_batch_size=90)
    t.handle("a", Progress(0, 30, 10.0, upload=MBIT, download=MBIT))
    t.handle("b", Progress(0, 30, 10.0, upload=MBIT, download=MBIT))
    start = sent(t.handle("c", Progress(0, 30, 10.0, upload=1e-5, download=1e-5)), RoundStart)[0][1]
    share = dict(zip(start.group, start.shares, strict=True))
    assert sum(start.shares) == pytest.approx(1) and share["c"] == 0


def test_unmeasured_links_get_equal_shares_and_a_boast_is_capped(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"), target_batch_size=90)
    start = open_round(t, {"a": 30, "b": 30, "c": 30})
    assert start.shares == pytest.approx([1 / 3] * 3)
    t.handle("b", done(start, received={p: 30 for p in start.group}))
    t.handle("c", done(start, received={p: 30 for p in start.group}))
    t.handle("a", done(start, received={p: 30 for p in start.group}))
    t.handle("a", Ready(1, "h1"))
    t.handle("b", Ready(1, "h1"))
    t.handle("c", Ready(1, "h1"))
    # c says it has a datacenter's link: it counts for 16 times the typical one, and no more.
    t.handle("a", Progress(1, 30, 10.0, upload=MBIT, download=MBIT))
    t.handle("b", Progress(1, 30, 10.0, upload=MBIT, download=MBIT))
    start = sent(t.handle("c", Progress(1, 30, 10.0, upload=10**12, download=10**12)), RoundStart)[0][1]
    links = [Member(MBIT, MBIT), Member(MBIT, MBIT), Member(16 * MBIT, 16 * MBIT)]
    assert start.shares == pytest.approx(balance(links, 1.0).shares)
    assert balance(links, 1.0).seconds < round_time([1, 1, 1], links, 1.0)
