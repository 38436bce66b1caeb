"""The tracker's rules, driven directly: no network, a controllable clock."""

import pytest

from engine.backbone.tracker import Broadcast, RecordCredits, RecordStep, RoundOpened, Send, Tracker
from engine.backbone.tracker.checkpoint_requests import START_PATIENCE
from engine.planning.load_balancing import Member, balance, round_time
from engine.project import ProjectSpec
from engine.wire.control import (
    Availability,
    BadState,
    CheckpointInfo,
    Progress,
    Ready,
    Reassign,
    Resync,
    RoundDone,
    RoundStart,
    Step,
    SyncPlan,
    SyncRequest,
)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def project(**kw):
    return ProjectSpec(**{"id": "p", "title": "P", "task": "demo-lm", "target_batch_size": 100,
                          "round_timeout": 10, "checkpoint_every": 2, **kw})


def sent(outs, kind):
    return [(o.to, o.msg) for o in outs if isinstance(o, Send) and isinstance(o.msg, kind)]


@pytest.fixture
def clock():
    return Clock()


def open_round(t, samples, computing=1.0):
    """Report ``samples`` per peer (a dict), after ``computing`` seconds of compute (the
    backbone counts no more samples than time allows), and return the RoundStart that opened."""
    t.clock.now += computing
    starts = []
    for peer, n in samples.items():
        starts += sent(t.handle(peer, Progress(t.epoch, n, 10.0)), RoundStart)
    assert starts, "no round opened"
    return starts[0][1]


def ready_tracker(clock, peers=("a", "b"), **kw):
    """A collaboration at epoch 0 whose state "h0" is settled and checkpointed: joiners
    copy it from a peer (with no checkpoint, epoch 0 is the seed everyone builds alone)."""
    t = Tracker(project(**kw), clock=clock, state_sha256="h0",
                checkpoint=CheckpointInfo(0, "s" * 64, "h0", 10, "/c"))
    for p in peers:
        t.join(p, p)
        t.handle(p, SyncRequest())
        t.handle(p, Ready(0, "h0"))
    return t


def done(start, digest="h1", ok=True, **kw):
    """A member's outcome; as a reducer, it got a part from every member (unless told)."""
    kw.setdefault("received", {p: 1 for p in start.group} if ok else {})
    return RoundDone(start.round_id, start.epoch, ok, digest if ok else None, **kw)


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


def test_checkpoints_are_requested_every_k_epochs(clock):
    t = ready_tracker(clock, checkpoint_every=2)
    starts = []
    for epoch in range(4):
        start = open_round(t, {"b": 0, "a": 100})
        starts.append(start)
        for p in ("a", "b"):
            t.handle(p, done(start, f"h{epoch + 1}"))
        if start.checkpoint_by:
            assert t.expects_checkpoint(start.checkpoint_by, epoch + 1)
            t.checkpoint_stored(start.checkpoint_by, CheckpointInfo(epoch + 1, "s", "p", 1, "/"))
    assert [s.checkpoint_by is not None for s in starts] == [False, True, False, True]


def test_the_state_is_uploaded_by_the_fastest_uplink_not_still_uploading_one(clock):
    """A state is hundreds of MB on a home uplink: the fastest voter uploads it; one whose
    last checkpoint has not come (slow, or claiming a speed it lacks) is passed over."""
    t = ready_tracker(clock, peers=("a", "b", "c"), checkpoint_every=1)
    uploads = {"a": 1e6, "b": 8e6, "c": 3e6}
    chosen = []
    for epoch in range(3):
        clock.now += 1.0
        starts = []
        for peer, up in uploads.items():
            report = Progress(t.epoch, 40, 10.0, upload=up, download=4 * up)
            starts += sent(t.handle(peer, report), RoundStart)
        start = starts[0][1]
        chosen.append(start.checkpoint_by)
        for p in uploads:
            t.handle(p, done(start, f"h{epoch + 1}"))
        if epoch == 1:  # c delivers; b, asked first, never does
            t.checkpoint_stored("c", CheckpointInfo(epoch + 1, "s", "p", 1, "/"))
    assert chosen == ["b", "c", "c"]


def test_a_checkpoint_on_its_way_is_not_asked_again_until_its_request_lapses(clock):
    """Nobody uploads here: each request waits out its patience, and meanwhile the next is
    due k epochs after it, not every round (a second upload of the same chore)."""
    t = ready_tracker(clock, checkpoint_every=2)
    asked = []
    for epoch in range(6):
        start = open_round(t, {"b": 0, "a": 100})
        asked.append(start.checkpoint_by)
        for p in ("a", "b"):
            t.handle(p, done(start, f"h{epoch + 1}"))
        if epoch == 3:
            clock.now += START_PATIENCE
    # Epoch 2's request goes to a, epoch 4's to b (a still owes one), both lapse, and the
    # one after, due at once, goes to a again.
    assert asked == [None, "a", None, "b", "a", None]
    assert t.expects_checkpoint("a", 5) and not t.expects_checkpoint("a", 2)


def test_a_checkpoint_upload_under_way_is_waited_for_and_a_broken_one_is_not(clock):
    t = ready_tracker(clock, checkpoint_every=1)
    start = open_round(t, {"b": 0, "a": 100})
    for p in ("a", "b"):
        t.handle(p, done(start, "h1"))
    assert t.checkpoint_upload("a", 1, started=True)
    assert not t.checkpoint_upload("a", 1, started=True)  # one upload at a time
    clock.now += 2 * START_PATIENCE  # a slow uplink: still uploading
    assert t.expects_checkpoint("a", 1)
    t.checkpoint_upload("a", 1, started=False)  # its connection broke
    assert not t.expects_checkpoint("a", 1)


def test_a_checkpoint_of_a_later_epoch_answers_the_chore(clock):
    """Where rounds outrun its snapshot, the asked peer's state is a step on when it takes
    it: before, that upload was refused and the chore owed for five minutes, and that
    epoch never got its checkpoint (CI waited 300 s for one)."""
    t = ready_tracker(clock, checkpoint_every=1)
    start = open_round(t, {"b": 0, "a": 100})
    for p in ("a", "b"):
        t.handle(p, done(start, "h1"))
    asked = start.checkpoint_by
    assert asked is not None and not t.expects_checkpoint(asked, 0)
    assert t.expects_checkpoint(asked, 2) and t.checkpoint_upload(asked, 2, started=True)
    t.checkpoint_stored(asked, CheckpointInfo(2, "s", "p", 1000, "/"))
    assert not t.expects_checkpoint(asked, 2) and asked not in t.checkpoint_requests.uploading()
    assert t.checkpoint_requests.failures(asked) == 0


def settled_round(clock, t, claims: dict[str, float], epoch: int) -> RoundStart:
    """A round the peers open by reporting their samples with these uplink claims, and settle."""
    clock.now += 6.0
    starts = []
    for peer, up in claims.items():
        starts += sent(t.handle(peer, Progress(t.epoch, 60, 10.0, upload=up, download=up)), RoundStart)
    start = starts[0][1]
    for peer in claims:
        t.handle(peer, done(start, f"h{epoch + 1}"))
    return start


def test_a_peer_whose_uploads_fail_loses_the_chore_to_one_that_delivers(clock):
    """Before: a failed upload freed its peer at once, so one claiming the fastest uplink
    that failed every upload was asked every round, and nobody else ever."""
    t = ready_tracker(clock, peers=("a", "b"), checkpoint_every=1)
    uploads = {"a": 1e9, "b": 1e6}  # a claims the faster uplink
    chosen = []
    for epoch in range(4):
        start = settled_round(clock, t, uploads, epoch)
        chosen.append(start.checkpoint_by)
        if start.checkpoint_by == "a":  # a fails at once, every time
            assert t.checkpoint_upload("a", epoch + 1, started=True)
            t.checkpoint_upload("a", epoch + 1, started=False)
        else:
            t.checkpoint_stored("b", CheckpointInfo(epoch + 1, "s", "p", 1, "/"))
    assert chosen == ["a", "b", "b", "b"]


def test_the_chore_goes_by_the_uplink_a_stored_upload_showed_not_by_the_claim(clock):
    """a claims a gigabyte a second and delivers at 100 kB/s: once seen, b's honest 1 MB/s
    claim outranks it, and b keeps the chore as long as its uploads show the faster uplink."""
    t = ready_tracker(clock, peers=("a", "b"), checkpoint_every=1)
    claims, delivery = {"a": 1e9, "b": 1e6}, {"a": 100e3, "b": 2e6}
    size = 4_000_000
    chosen = []
    for epoch in range(3):
        chosen.append(uploader := settled_round(clock, t, claims, epoch).checkpoint_by)
        assert uploader is not None and t.checkpoint_upload(uploader, epoch + 1, started=True)
        clock.now += size / delivery[uploader]
        t.checkpoint_stored(uploader, CheckpointInfo(epoch + 1, "s", "p", size, "/"))
    assert chosen == ["a", "b", "b"]


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


def fail_pair(t, start, x, y):
    """``x`` and ``y`` report that they could not exchange; the rest of the group succeeds."""
    t.handle(x, RoundDone(start.round_id, start.epoch, False, error="link", unreachable=[y]))
    t.handle(y, RoundDone(start.round_id, start.epoch, False, error="link", unreachable=[x]))


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


MBIT = 125_000  # bytes per second


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
