"""The tracker after a backbone restart: the round open at the crash settles on its members'
replays, and askers wait for the holders of the epoch. No network, a controllable clock."""

from engine.backbone.tracker import RecordCredits, RecordStep, RoundOpened, Tracker
from engine.wire.control import Ready, Resync, RoundDone, SyncPlan, SyncRequest
from tests.unit.tracker_helpers import clock, project, sent

__all__ = ["clock"]  # the fixture


def test_a_step_taken_while_the_backbone_was_down_settles_on_its_members_replays(clock):
    """Restarted at epoch 4 with round 77 open at the crash: its members come back and say how
    it ended; a majority of them settles it (recorded, credited to nobody)."""
    t = Tracker(project(), clock=clock, epoch=4, state_sha256="h4",
                unsettled=RoundOpened(77, 4, ["a", "b", "c"]))
    for p in "abc":
        t.join(p, p)
    replay = RoundDone(77, 4, True, "h5", samples=120, loss=2.0, seconds=0.5)
    assert not [o for o in t.handle("a", replay) if isinstance(o, RecordStep)], "one peer's word"
    assert not sent(t.handle("a", Ready(5, "h5")), Resync) and t.epoch == 4  # it waits for the others
    outs = t.handle("b", replay)
    (record,) = [o for o in outs if isinstance(o, RecordStep)]
    step = record.step
    assert (step.epoch, step.round_id, step.samples, step.loss, step.peers) == (5, 77, 120, 2.0, 3)
    assert (t.epoch, t.state_sha256) == (5, "h5")
    outs = t.handle("c", RoundDone(77, 4, False, error="x"))
    assert not [o for o in outs if isinstance(o, RecordCredits)], "a replay credits nobody"
    assert {p.peer_id for p in t.live_peers()} == {"a", "b"}


def test_a_replayed_round_waits_for_members_still_reconnecting(clock):
    """After a restart the members come back one by one: the first one's replay neither
    settles the round nor closes it, so the second one's still counts."""
    t = Tracker(project(), clock=clock, epoch=4, state_sha256="h4",
                unsettled=RoundOpened(77, 4, ["a", "b", "c"]), recovery=60)
    t.join("a", "a")
    replay = RoundDone(77, 4, True, "h5", samples=120)
    assert not sent(t.handle("a", replay), Resync)
    assert not sent(t.handle("a", Ready(5, "h5")), Resync) and t.round is not None
    clock.now += 2
    t.join("b", "b")
    assert [o.step.epoch for o in t.handle("b", replay) if isinstance(o, RecordStep)] == [5]
    t.join("c", "c")
    assert not sent(t.handle("c", Ready(5, "h5")), Resync)  # back late, with the settled state
    assert {p.peer_id for p in t.live_peers()} == {"a", "b", "c"}


def test_after_a_restart_an_asker_waits_for_the_holders_of_the_epoch(clock):
    """No peer is back yet and no checkpoint holds epoch 4: one that asks for the state does
    not send the collaboration back to the start; a holder's Ready answers it."""
    t = Tracker(project(), clock=clock, epoch=4, state_sha256="h4", recovery=60)
    t.join("x", "x")
    assert not t.handle("x", SyncRequest()) and t.epoch == 4
    t.join("a", "a")
    ((to, plan),) = sent(t.handle("a", Ready(4, "h4")), SyncPlan)
    assert (to, plan.source, plan.peer, plan.epoch) == ("x", "peer", "a", 4)


def test_when_no_holder_comes_back_after_a_restart_the_collaboration_starts_over(clock):
    t = Tracker(project(), clock=clock, epoch=4, state_sha256="h4", recovery=60)
    t.join("x", "x")
    t.handle("x", SyncRequest())
    clock.now += 30
    assert not sent(t.tick(), SyncPlan)
    clock.now += 31
    ((to, plan),) = sent(t.tick(), SyncPlan)
    assert (to, plan.source, t.epoch) == ("x", "init", 0)


def test_a_replayed_round_nobody_else_confirms_moves_nothing(clock):
    t = Tracker(project(), clock=clock, epoch=4, state_sha256="h4",
                unsettled=RoundOpened(77, 4, ["a", "b", "c"]))
    for p in "abc":
        t.join(p, p)
    t.handle("a", RoundDone(77, 4, True, "forged", samples=10**12))
    clock.now += 100
    outs = t.tick()
    assert t.epoch == 4 and not [o for o in outs if isinstance(o, RecordStep)]
    assert [to for to, msg in sent(outs, Resync) if msg.state_sha256 == "h4"][:1] == ["a"]
