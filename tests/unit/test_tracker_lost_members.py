"""Members lost mid-round: their part moves to a live reducer, the others are told, and the
round still closes. Driven directly: no network, a controllable clock."""

from engine.backbone.tracker import RecordCredits
from engine.wire.control import Progress, Reassign, Resync, RoundStart
from tests.unit.tracker_helpers import MBIT, clock, done, open_round, ready_tracker, sent

__all__ = ["clock"]  # the fixture


def test_a_peer_that_leaves_mid_round_does_not_block_closing_it(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"))
    start = open_round(t, {"b": 0, "c": 0, "a": 100})
    t.handle("a", done(start))
    t.handle("b", done(start))
    t.leave("c")
    assert t.round is None and t.epoch == 1


def test_a_member_that_leaves_does_not_count_against_the_majority(clock):
    t = ready_tracker(clock, peers=("a", "b"))
    start = open_round(t, {"b": 0, "a": 100})
    t.handle("a", done(start))
    t.leave("b")  # crashed mid-round: the one that stayed decides
    assert t.round is None and (t.epoch, t.state_sha256) == (1, "h1")


def test_a_reducer_lost_mid_round_hands_its_part_to_the_fastest_live_member(clock):
    """Its part goes to the member the LP gave the most; the others hear at once, the round
    settles on the live members' word, and the lost one is credited with nothing."""
    t = ready_tracker(clock, peers=("a", "b", "c", "d"))
    t.handle("a", Progress(0, 25, 10.0, upload=40 * MBIT, download=40 * MBIT))
    t.handle("b", Progress(0, 25, 10.0, upload=20 * MBIT, download=20 * MBIT))
    t.handle("c", Progress(0, 25, 10.0, upload=20 * MBIT, download=20 * MBIT))
    start = sent(t.handle("d", Progress(0, 25, 10.0, upload=20 * MBIT, download=20 * MBIT)), RoundStart)[0][1]
    share = dict(zip(start.group, start.shares, strict=True))
    assert share["a"] > share["c"] > 0
    outs = t.leave("c")
    told = sent(outs, Reassign)
    assert sorted(to for to, _ in told) == ["a", "b", "d"]
    msg = told[0][1]
    assert msg.lost == ["c"] and msg.reducers[start.group.index("c")] == "a"
    others = [p for p in start.group if p != "c"]
    assert [r for j, r in enumerate(msg.reducers) if start.group[j] != "c"] == others
    seen = {"a": 25, "b": 25, "c": 25, "d": 25}  # c's part reached some reducers before it died
    outs = []
    for p in "abd":
        outs += t.handle(p, done(start, samples=75, received=seen))
    assert (t.epoch, t.round) == (1, None)
    (record,) = [o for o in outs if isinstance(o, RecordCredits)]
    assert set(record.credits) == {"a", "b", "d"}


def test_a_sender_lost_mid_round_is_waited_for_no_longer_and_a_second_loss_moves_the_backup(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"))
    start = open_round(t, {"a": 40, "b": 40, "c": 40})
    first = t.round.reducers[:]
    outs = t.leave("b")
    ((_, msg),) = sent(outs, Reassign)[:1]
    assert msg.lost == ["b"] and "b" not in msg.reducers and set(msg.reducers) <= {"a", "c"}
    backup = msg.reducers[first.index("b")]
    outs = t.leave(backup)
    ((to, msg),) = sent(outs, Reassign)
    (alive,) = {"a", "c"} - {backup}
    assert to == alive and msg.lost == sorted({"b", backup}) and msg.reducers == [alive] * len(start.group)


def test_a_member_lost_after_it_answered_changes_nothing(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"))
    start = open_round(t, {"a": 40, "b": 40, "c": 40})
    t.handle("a", done(start))
    assert not sent(t.leave("a"), Reassign)


def test_with_nobody_to_take_the_part_over_the_members_are_told_at_once(clock):
    t = ready_tracker(clock, peers=("a", "b"))
    t.handle("b", Progress(0, 50, 10.0, client_mode=True))
    start = open_round(t, {"a": 60})
    assert start.shares == [1.0, 0.0] if start.group[0] == "a" else [0.0, 1.0]
    ((to, msg),) = sent(t.leave("a"), Reassign)
    assert to == "b" and msg.lost == ["a"] and msg.reducers == start.group  # so its round fails now


def test_at_the_deadline_those_that_answered_settle_and_the_silent_are_resynced(clock):
    t = ready_tracker(clock)
    start = open_round(t, {"b": 0, "a": 100})
    t.handle("a", done(start))
    clock.now += start.timeout + 10
    outs = t.tick()
    assert [to for to, _ in sent(outs, Resync)] == ["b"] and t.round is None
    assert (t.epoch, t.state_sha256) == (1, "h1")
