"""The tracker's answer to a report that may reach the target: the others' counts at once,
so the peer goes no further than the step needs -- once per count, as a status costs the
backbone a pass over its members and a stranger repeating its report must not buy one
with each message."""

from engine.backbone.tracker import Send
from engine.wire.control import Progress, Ready, RoundStart, Status, SyncRequest
from tests.unit.test_round_evidence import two_ready_peers
from tests.unit.tracker_helpers import Clock


def answers(outs: list, to: str) -> list:
    return [o.msg for o in outs if isinstance(o, Send) and o.to == to]


def asks(samples: int, epoch: int = 0) -> Progress:
    return Progress(epoch, samples, 10.0, 1.0, 1.0, asks_status=True)


def test_an_ask_is_answered_at_once_with_the_others_counts():
    clock = Clock()
    tracker = two_ready_peers(clock, 100)
    clock.now += 1
    tracker.handle("other", Progress(0, 40, 10.0, 1.0, 1.0))
    [status] = answers(tracker.handle("me", asks(30)), "me")
    assert isinstance(status, Status) and status.samples == 70 and status.counts_you
    assert answers(tracker.handle("me", Progress(0, 40, 10.0, 1.0, 1.0)), "me") == [], \
        "a report that does not ask gets no answer"


def test_the_same_ask_again_gets_no_second_answer_and_a_new_count_does():
    clock = Clock()
    tracker = two_ready_peers(clock, 100)
    clock.now += 1
    assert len(answers(tracker.handle("me", asks(30)), "me")) == 1
    for _ in range(100):
        assert answers(tracker.handle("me", asks(30)), "me") == []
    assert len(answers(tracker.handle("me", asks(34)), "me")) == 1


def test_an_ask_that_reaches_the_target_gets_the_round_not_a_status():
    clock = Clock()
    tracker = two_ready_peers(clock, 100)
    clock.now += 1
    tracker.handle("other", Progress(0, 60, 60.0, 1.0, 1.0))
    [answer] = answers(tracker.handle("me", asks(40)), "me")
    assert isinstance(answer, RoundStart)


def test_a_peer_not_ready_is_not_answered():
    clock = Clock()
    tracker = two_ready_peers(clock, 100)
    tracker.join("late", "late")
    tracker.handle("late", SyncRequest())
    clock.now += 1
    assert answers(tracker.handle("late", asks(30)), "late") == []
    tracker.handle("late", Ready(0, "h0"))
    clock.now += 1
    assert [type(m) for m in answers(tracker.handle("late", asks(31)), "late")] == [Status]


def test_an_ask_of_the_next_epoch_before_it_settled_is_not_answered():
    """A peer steps before the backbone settles its round: the status of the epoch before
    would tell it the others hold nothing yet, and it would compute the whole target."""
    clock = Clock()
    tracker = two_ready_peers(clock, 100)
    clock.now += 1
    tracker.handle("other", Progress(0, 60, 60.0, 1.0, 1.0))
    tracker.handle("me", Progress(0, 40, 40.0, 1.0, 1.0))
    assert tracker.round is not None
    assert answers(tracker.handle("me", asks(8, epoch=1)), "me") == []


def test_an_answer_says_how_old_the_others_counts_are():
    """A peer reports every half second until the target is near: the others' counts in an
    answer are that old, and they computed meanwhile (digits' peers, timing them from the
    answer, went 6-12 micro-batches each past the target)."""
    clock = Clock()
    tracker = two_ready_peers(clock, 100)
    clock.now += 1
    tracker.handle("other", Progress(0, 40, 40.0, 1.0, 1.0))
    clock.now += 0.4
    [status] = answers(tracker.handle("me", asks(30)), "me")
    assert abs(status.counts_age - 0.4) < 1e-6, "the other's count, not the asker's own fresh one"


def test_the_first_ask_of_an_epoch_tells_the_silent_peers_the_counts_once():
    """A peer far from the target by its own estimate reports every half second and
    computes on unseen meanwhile: the first ask of an epoch has the backbone tell it the
    counts, so it asks too. Once an epoch: a status to all costs what a broadcast does."""
    clock = Clock()
    tracker = two_ready_peers(clock, 100)
    clock.now += 1
    tracker.handle("other", Progress(0, 40, 40.0, 1.0, 1.0))
    clock.now += 0.3
    out = tracker.handle("me", asks(30))
    [told] = answers(out, "other")
    assert isinstance(told, Status) and told.samples == 70
    clock.now += 0.3
    assert answers(tracker.handle("me", asks(34)), "other") == [], "once an epoch"


def test_a_peer_that_reported_just_now_is_not_told_again():
    clock = Clock()
    tracker = two_ready_peers(clock, 100)
    clock.now += 1
    tracker.handle("other", Progress(0, 40, 40.0, 1.0, 1.0))
    clock.now += 0.001
    assert answers(tracker.handle("me", asks(30)), "other") == []
