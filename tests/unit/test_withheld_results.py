"""A reducer that takes the parts and withholds its results: the round cannot settle, and the
tracker must tell that reducer from its victims on the word of a majority, never of one."""

from engine.wire.control import Ready, RoundDone
from tests.unit.tracker_helpers import clock, done, open_round, ready_tracker

__all__ = ["clock"]  # the fixture


def test_a_reducer_most_others_waited_for_is_struck_and_sits_out_after_twice(clock):
    t = ready_tracker(clock, peers=("a", "b", "c", "x"))
    for attempt in range(2):
        clock.now += 2
        t.handle("x", Ready(0, "h0"))  # back at the settled state, as it was told to
        start = open_round(t, {p: 30 for p in "abcx"})
        assert start.shares[start.group.index("x")] > 0
        t.handle("x", done(start, digest="hx"))  # it has every result; nobody has its own
        for p in "abc":
            t.handle(p, done(start, ok=False, waiting=["x"]))
        assert t.round is None and t.epoch == 0
        assert t.peers["x"].strikes == attempt + 1
        assert all(t.peers[p].strikes == 0 for p in "abc")
    assert t.peers["x"].excluded_until > clock.now


def test_one_voters_word_strikes_nobody(clock):
    """A liar that says it waited for an honest reducer, while the others were fine."""
    t = ready_tracker(clock, peers=("a", "b", "c", "liar"))
    start = open_round(t, {p: 30 for p in ("a", "b", "c", "liar")})
    t.handle("liar", done(start, ok=False, waiting=["a"]))
    for p in "bc":
        t.handle(p, done(start, ok=False))
    t.handle("a", done(start, ok=False))
    assert t.round is None and t.peers["a"].strikes == 0


def test_in_a_round_of_two_voters_one_cannot_strike_the_other(clock):
    t = ready_tracker(clock, peers=("a", "b"))
    start = open_round(t, {"a": 50, "b": 50})
    t.handle("b", done(start, ok=False, waiting=["a"]))
    t.handle("a", done(start, ok=False))
    assert t.round is None and t.peers["a"].strikes == 0


def test_a_reducer_that_names_a_sender_it_missed_is_not_the_one_struck(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"))
    start = open_round(t, {p: 40 for p in "abc"})
    t.handle("c", RoundDone(start.round_id, 0, False, None, error="no part from b", unreachable=["b"]))
    for p in "ab":
        t.handle(p, done(start, ok=False, waiting=["c"]))
    assert t.peers["c"].strikes == 0 and not t.pairs.reachable("b", "c", clock.now)
