"""How peers get the collaboration's state: seed or donor, donors avoided or accused,
checkpoint fallbacks, paused peers and resyncs. Driven directly: no network, a controllable clock."""

from engine.backbone.tracker import Send, Tracker
from engine.wire.control import (
    Availability,
    BadState,
    CheckpointInfo,
    Progress,
    Ready,
    Resync,
    RoundDone,
    SyncPlan,
    SyncRequest,
)
from tests.unit.tracker_helpers import clock, done, open_round, project, ready_tracker, sent

__all__ = ["clock"]  # the fixture


def test_every_peer_builds_epoch_0_from_the_seed_and_later_ones_copy_a_peer(clock):
    t = Tracker(project(), clock=clock)
    for p in "ab":
        t.join(p, p)
        ((_, plan),) = sent(t.handle(p, SyncRequest()), SyncPlan)
        assert plan.source == "init" and plan.epoch == 0
        t.handle(p, Ready(0, "h0"))
    start = open_round(t, {"a": 60, "b": 60})
    for p in "ab":
        t.handle(p, done(start))
    t.join("c", "c")
    ((_, plan),) = sent(t.handle("c", SyncRequest()), SyncPlan)
    assert (plan.source, plan.epoch, plan.state_sha256) == ("peer", 1, "h1")  # and what to expect


def test_excluded_donors_are_avoided_when_another_exists(clock):
    t = ready_tracker(clock, peers=("a", "b"))
    t.join("c", "c")
    ((_, plan),) = sent(t.handle("c", SyncRequest(exclude=["a"])), SyncPlan)
    assert plan.peer == "b"


def test_a_donor_accused_by_the_joiner_it_served_is_asked_after_the_others(clock):
    """A joiner's word counts once, and only against the donor it was sent to: a peer
    accusing every other over and over cannot put itself first in line."""
    t = ready_tracker(clock, peers=("a", "b"))
    t.join("c", "c")
    ((_, plan),) = sent(t.handle("c", SyncRequest()), SyncPlan)
    first = plan.peer
    other = "b" if first == "a" else "a"
    for _ in range(5):
        t.handle("c", BadState(other, "forged"))  # not the donor it was sent to: moves nothing
    t.handle("c", BadState(first, "its hash is not the collaboration's"))
    ((_, plan),) = sent(t.handle("c", SyncRequest(exclude=[first])), SyncPlan)
    assert plan.peer == other  # busy serving c now, yet still asked before the accused one
    t.join("d", "d")
    ((_, plan),) = sent(t.handle("d", SyncRequest()), SyncPlan)
    assert plan.peer == other
    assert (len(t.peers[first].accusers), len(t.peers[other].accusers)) == (1, 0)


def test_a_joiner_that_no_peer_could_serve_falls_back_to_a_checkpoint_of_this_epoch(clock):
    t = ready_tracker(clock, peers=("a", "b"))
    t.checkpoint = CheckpointInfo(0, "s" * 64, "h0", 10, "/c")
    t.join("c", "c")
    ((_, plan),) = sent(t.handle("c", SyncRequest(exclude=["a", "b"])), SyncPlan)
    assert (plan.source, plan.epoch, plan.state_sha256) == ("checkpoint", 0, "h0")
    assert t.epoch == 0


def test_an_older_checkpoint_is_no_fallback_while_peers_hold_the_epoch(clock):
    t = ready_tracker(clock, peers=("a", "b"))
    start = open_round(t, {"a": 60, "b": 60})
    for p in "ab":
        t.handle(p, done(start))
    t.checkpoint = CheckpointInfo(0, "s" * 64, "h0", 10, "/c")
    t.join("c", "c")
    ((_, plan),) = sent(t.handle("c", SyncRequest(exclude=["a", "b"])), SyncPlan)
    assert plan.source == "peer" and t.epoch == 1  # try them again; never rewind the others


def test_a_silent_donor_is_asked_last(clock):
    t = ready_tracker(clock, peers=("a", "b"))
    clock.now += 20
    t.handle("b", Progress(0, 5, 1.0))  # a went quiet (hung, or its network is gone)
    t.join("c", "c")
    ((_, plan),) = sent(t.handle("c", SyncRequest()), SyncPlan)
    assert plan.peer == "b"


def test_a_paused_peer_is_not_resynced_until_it_resumes(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"))
    t.handle("c", Availability(paused=True))
    start = open_round(t, {"a": 60, "b": 60})
    assert start.group == ["a", "b"]
    outs = t.handle("a", done(start))
    outs += t.handle("b", done(start))
    assert not sent(outs, Resync), "a paused peer would download the state while its owner works"
    ((to, resync),) = sent(t.handle("c", Availability(paused=False)), Resync)
    assert to == "c" and resync.epoch == 1


def test_peers_paused_through_a_rewind_to_a_checkpoint_are_resynced_on_resuming(clock):
    t = ready_tracker(clock, peers=("a", "b"))
    t.checkpoint = CheckpointInfo(0, "s" * 64, "h0", 10, "/c")
    start = open_round(t, {"a": 60, "b": 60})
    for p in "ab":
        t.handle(p, done(start))
    for p in "ab":
        t.handle(p, Availability(paused=True))
    t.join("c", "c")  # nobody can serve epoch 1: the collaboration goes back to the checkpoint
    ((_, plan),) = sent(t.handle("c", SyncRequest()), SyncPlan)
    assert (plan.source, t.epoch) == ("checkpoint", 0)
    t.handle("c", Ready(0, "h0"))
    ((to, resync),) = sent(t.handle("a", Availability(paused=False)), Resync)
    assert to == "a" and resync.epoch == 0
    ((to, resync),) = sent(t.handle("b", Progress(1, 10, 1.0)), Resync)  # reported before resuming
    assert to == "b" and resync.epoch == 0


def test_a_late_round_outcome_moves_nothing(clock):
    t = ready_tracker(clock)
    assert not t.handle("a", RoundDone(99, 0, True, "elsewhere", samples=100))
    assert (t.epoch, t.state_sha256) == (0, "h0")


def test_a_ready_for_the_next_epoch_never_moves_the_collaboration(clock):
    """The takeover of one message: Ready(E+1, any hash) with no round open."""
    t = ready_tracker(clock)
    t.join("mallory", "mallory")
    outs = t.handle("mallory", Ready(1, "f" * 64))
    assert (t.epoch, t.state_sha256) == (0, "h0")
    assert sent(outs, Resync) and not [o for o in outs if not isinstance(o, Send)]


def test_peers_outside_the_round_are_resynced_when_it_advances(clock):
    t = ready_tracker(clock)
    start = open_round(t, {"b": 0, "a": 100})
    t.join("late", "late")
    t.handle("late", SyncRequest())
    t.handle("late", Ready(0, "h0"))
    t.handle("a", done(start))
    outs = t.handle("b", done(start))
    assert ("late" in [to for to, _ in sent(outs, Resync)])


def test_ready_with_a_stale_epoch_or_wrong_hash_is_resynced(clock):
    t = ready_tracker(clock)
    t.join("c", "c")
    assert sent(t.handle("c", Ready(0, "wrong")), Resync)
    assert sent(t.handle("c", Ready(5, "h0")), Resync)
    assert not sent(t.handle("c", Ready(0, "h0")), Resync)


def test_with_nobody_left_a_joiner_resumes_from_the_latest_checkpoint(clock):
    ckpt = CheckpointInfo(4, "f" * 64, "p" * 64, 123, "/x")
    t = Tracker(project(), epoch=5, state_sha256="h5", checkpoint=ckpt, clock=clock)
    t.join("a", "a")
    ((_, plan),) = sent(t.handle("a", SyncRequest()), SyncPlan)
    assert plan.source == "checkpoint" and plan.epoch == 4 and plan.state_sha256 == "p" * 64
    assert not sent(t.handle("a", Ready(4, "p" * 64)), Resync)
