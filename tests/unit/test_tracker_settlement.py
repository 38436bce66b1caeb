"""How a round settles: the majority of members decides the step, dissenters resync, and
credit is what the reducers saw. Driven directly: no network, a controllable clock."""

import pytest

from engine.backbone.tracker import Broadcast, RecordCredits, RecordStep
from engine.wire.control import Progress, Ready, Resync, RoundStart, Step, SyncRequest
from tests.unit.tracker_helpers import clock, done, open_round, ready_tracker, sent

__all__ = ["clock"]  # the fixture


def test_a_majority_of_members_settles_the_epoch_and_it_is_recorded(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"))
    start = open_round(t, {"a": 70, "b": 40, "c": 10})
    clock.now += 2
    assert not t.handle("a", done(start, samples=120, loss=2.5)) or t.epoch == 0  # one of three
    assert t.epoch == 0
    outs = t.handle("b", done(start, samples=120, loss=2.7))
    (record,) = [o for o in outs if isinstance(o, RecordStep)]
    assert (record.step.epoch, record.step.samples, record.step.peers) == (1, 120, 3)
    assert record.step.loss == pytest.approx(2.6)  # the median of those that agree
    assert any(isinstance(o, Broadcast) and isinstance(o.msg, Step) for o in outs)
    assert t.epoch == 1 and t.round is not None  # still waiting for c
    t.handle("c", done(start, samples=120, loss=2.5))
    assert t.round is None


def test_the_first_report_decides_nothing_while_others_may_still_disagree(clock):
    t = ready_tracker(clock)
    start = open_round(t, {"a": 70, "b": 40})
    t.handle("a", done(start, "forged", samples=10**12))
    assert (t.epoch, t.state_sha256) == (0, "h0")
    outs = t.handle("b", done(start))  # one against one: no strict majority, nothing settles
    assert (t.epoch, t.state_sha256) == (0, "h0") and t.round is None
    assert {to for to, msg in sent(outs, Resync) if msg.state_sha256 == "h0"} == {"a", "b"}


def test_a_member_whose_step_differs_resyncs_and_twice_in_a_row_sits_rounds_out(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"), target_batch_size=90)
    for epoch in range(2):
        start = open_round(t, {"a": 50, "b": 50, "c": 40})
        assert start.group == ["a", "b", "c"]
        t.handle("a", done(start, f"h{epoch + 1}"))
        t.handle("b", done(start, f"h{epoch + 1}"))
        outs = t.handle("c", done(start, "DIFFERENT"))
        assert sent(outs, Resync)[0][0] == "c"
        t.handle("c", SyncRequest())
        t.handle("c", Ready(epoch + 1, f"h{epoch + 1}"))
    start = open_round(t, {"a": 50, "b": 50, "c": 50})
    assert start.group == ["a", "b"], "a peer that dissented twice is still in rounds"
    t.handle("a", done(start, "h3"))
    t.handle("b", done(start, "h3"))
    clock.now += 31
    t.handle("c", SyncRequest())
    t.handle("c", Ready(3, "h3"))
    start = open_round(t, {"a": 50, "b": 50, "c": 50})
    assert start.group == ["a", "b", "c"] and start.optional == ["c"], "back on probation"


def test_a_failed_member_is_resynced_once_the_round_settled(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"))
    start = open_round(t, {"b": 0, "c": 0, "a": 100})
    t.handle("a", done(start))
    t.handle("b", done(start))
    assert sent(t.handle("c", done(start, ok=False, error="x")), Resync)


def test_when_everyone_fails_the_epoch_stays_and_a_new_round_follows_after_a_pause(clock):
    t = ready_tracker(clock)
    start = open_round(t, {"b": 0, "a": 100})
    t.handle("a", done(start, ok=False, error="x"))
    t.handle("b", done(start, ok=False, error="x"))
    assert t.epoch == 0 and t.round is None
    assert not sent(t.handle("a", Progress(0, 100, 10.0)), RoundStart)
    assert not sent(t.tick(), RoundStart)
    clock.now += 2
    assert sent(t.tick(), RoundStart)


def test_a_report_of_fewer_samples_during_the_round_does_not_shrink_a_members_credit(clock):
    t = ready_tracker(clock)
    t.handle("a", Progress(0, 8, 10.0))
    clock.now += 1
    start = open_round(t, {"b": 0, "a": 100})
    t.handle("a", Progress(0, 0, 10.0))  # sent after the round took its accumulator
    outs = t.handle("a", done(start, samples=104, received={"a": 52}))
    outs += t.handle("b", done(start, samples=104, received={"a": 52}))
    (record,) = [o for o in outs if isinstance(o, RecordCredits)]
    assert record.credits["a"].samples == 52


def test_credit_is_what_a_majority_of_reducers_saw_not_what_a_member_says(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"))
    start = open_round(t, {"a": 40, "b": 40, "c": 40})
    seen = {"a": 40, "b": 40, "c": 40}
    outs = t.handle("a", done(start, samples=10**12, received=seen))
    outs += t.handle("b", done(start, samples=120, received=seen))
    outs += t.handle("c", done(start, samples=120, received={"a": 10**9, "b": 0, "c": 40}))  # a liar
    (record,) = [o for o in outs if isinstance(o, RecordCredits)]
    assert {p: c.samples for p, c in record.credits.items()} == {"a": 40, "b": 40, "c": 40}


def test_a_member_that_withholds_its_result_and_reports_success_settles_nothing(clock):
    """In a round of two, mallory keeps its result from a (whose round then fails) and
    reports a forged step: one success against one failure settles nothing."""
    t = ready_tracker(clock)
    start = open_round(t, {"a": 50, "b": 50})
    t.handle("b", done(start, "forged"))
    outs = t.handle("a", done(start, ok=False, error="timeout", unreachable=["b"]))
    assert (t.epoch, t.state_sha256) == (0, "h0") and t.round is None
    assert [to for to, msg in sent(outs, Resync) if msg.state_sha256 == "h0"] == ["b"]


def test_a_member_that_resyncs_mid_round_has_answered(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"))
    start = open_round(t, {"a": 50, "b": 50, "c": 0})
    t.handle("a", done(start))
    t.handle("b", done(start))
    assert t.round is not None
    t.handle("c", SyncRequest())  # it gave up on the round
    assert t.round is None and t.epoch == 1
