"""The checkpoint chore: every k epochs, by the fastest uplink that delivers, asked again
only once a request lapses. Driven directly: no network, a controllable clock."""

from engine.backbone.tracker.checkpoint_requests import START_PATIENCE
from engine.wire.control import CheckpointInfo, Progress, RoundStart
from tests.unit.tracker_helpers import clock, done, open_round, ready_tracker, sent

__all__ = ["clock"]  # the fixture


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
