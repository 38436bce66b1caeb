"""Newcomers on probation: nobody waits for them until a part of theirs arrived and they
reported their step. Driven directly: no network, a controllable clock."""

from engine.backbone.tracker import RecordCredits
from engine.wire.control import Progress, Ready, Resync, RoundStart, SyncRequest
from tests.unit.tracker_helpers import clock, done, open_round, ready_tracker, sent

__all__ = ["clock"]  # the fixture


def with_newcomer(clock, name):
    """a and b settled epoch 1 ("h1"); ``name`` has just joined and holds that state."""
    t = ready_tracker(clock, peers=("a", "b"), target_batch_size=90)
    start = open_round(t, {"a": 50, "b": 50})
    for p in "ab":
        t.handle(p, done(start, "h1"))
    t.join(name, name)
    t.handle(name, SyncRequest())
    t.handle(name, Ready(1, "h1"))
    return t


def test_a_silent_newcomer_never_holds_a_round_and_soon_sits_rounds_out(clock):
    """Free identities that join and never send a part: on probation, nobody waits for
    them, their claimed samples open no round, and after two rounds unseen they are out."""
    t = with_newcomer(clock, "sybil")
    assert not sent(t.handle("sybil", Progress(1, 10**6, 1e6)), RoundStart), "its word opens nothing"
    for epoch in (1, 2):
        start = open_round(t, {"a": 50, "b": 50, "sybil": 10**6})
        assert (start.group, start.optional) == (["a", "b", "sybil"], ["sybil"])
        assert start.shares[start.group.index("sybil")] == 0
        t.handle("a", done(start, f"h{epoch + 1}", received={"a": 50, "b": 50}))
        t.handle("b", done(start, f"h{epoch + 1}", received={"a": 50, "b": 50}))
        assert t.round is None and t.epoch == epoch + 1, "the round did not wait for the silent one"
        t.handle("sybil", Progress(epoch + 1, 10, 1.0))  # it claims the step it never took
        t.handle("sybil", SyncRequest())
        t.handle("sybil", Ready(epoch + 1, f"h{epoch + 1}"))
    start = open_round(t, {"a": 50, "b": 50, "sybil": 10**6})
    assert start.group == ["a", "b"]


def test_a_newcomer_whose_part_arrived_is_proven_and_counts_from_then_on(clock):
    t = with_newcomer(clock, "c")
    start = open_round(t, {"a": 50, "b": 50, "c": 30})
    assert start.optional == ["c"]
    seen = {"a": 50, "b": 50, "c": 30}
    t.handle("a", done(start, "h2", received=seen))
    outs = t.handle("b", done(start, "h2", received=seen))
    assert next(o for o in outs if isinstance(o, RecordCredits)).credits["c"].samples == 30
    assert not sent(t.handle("c", done(start, "h2")), Resync), "its late outcome agrees"
    assert not sent(t.handle("a", Progress(2, 45, 10.0)), RoundStart)
    ((_, start), *_) = sent(t.handle("c", Progress(2, 45, 10.0)), RoundStart)  # its samples count now
    assert start.optional == [] and "c" in start.group


def test_a_newcomer_that_sends_parts_but_never_reports_its_step_stays_on_probation(clock):
    """Sending parts the reducers take is not taking part: a stranger that never steps
    would, as a voter with a share, hold every round until its timeout."""
    t = with_newcomer(clock, "c")
    for epoch in (1, 2):
        start = open_round(t, {"a": 50, "b": 50, "c": 30})
        assert start.optional == ["c"] and start.shares[start.group.index("c")] == 0
        seen = {"a": 50, "b": 50, "c": 30}
        for p in "ab":
            t.handle(p, done(start, f"h{epoch + 1}", received=seen))
        assert t.epoch == epoch + 1
        t.handle("c", Ready(epoch + 1, f"h{epoch + 1}"))  # it follows the broadcast steps
