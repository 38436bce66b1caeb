"""The tracker's rules for auxiliary peers (``cotrain peer --aux``): reducers that bring no
gradient, hold no state and never vote. Driven directly: no network, a controllable clock."""

from engine.backbone.tracker import RecordCredits, Tracker
from engine.backbone.tracker.settlement import REPORT_GRACE
from engine.backbone.tracker.trials import (
    MIN_TRIAL_TIMEOUT,
    RECENT_ROUNDS,
    TRIAL_SPACING,
    TRIAL_TIMEOUT_FACTOR,
    Trials,
)
from engine.planning.partition import part_sizes
from engine.planning.sizes import encoded_size
from engine.wire.control import Progress, Reassign, Resync, RoundDone, RoundStart
from engine.wire.types import PeerRole
from tests.unit.tracker_helpers import clock, done, open_round, ready_tracker, sent

__all__ = ["clock"]  # the fixture

MBIT = 125_000.0


def with_auxiliary(clock, *aux: str, links: dict | None = None, **kw) -> Tracker:
    """a and b train (10 Mbit/s each way); the ``aux`` peers joined as auxiliary ones and
    reported their links (100 Mbit/s unless ``links`` says otherwise)."""
    t = ready_tracker(clock, peers=("a", "b"), **kw)
    for p in aux:
        t.join(p, p, PeerRole.AUXILIARY)
        rate = (links or {}).get(p, 100 * MBIT)
        t.handle(p, Progress(0, 0, 0.0, upload=rate, download=rate))
    for p in "ab":
        t.handle(p, Progress(0, 0, 0.0, upload=10 * MBIT, download=10 * MBIT))
    return t


def aux_done(start: RoundStart, numel: int = 0, **kw) -> RoundDone:
    """An auxiliary member's outcome: no state, the parts it took."""
    kw.setdefault("received", {p: 50 for p in start.group if p not in start.auxiliary})
    return RoundDone(start.round_id, start.epoch, True, None, numel=numel, **kw)


def test_an_auxiliary_peer_with_the_fastest_link_reduces_most_and_brings_no_gradient(clock):
    t = with_auxiliary(clock, "x")
    start = open_round(t, {"a": 50, "b": 50})
    assert start.group == ["a", "b", "x"] and start.auxiliary == ["x"]
    shares = dict(zip(start.group, start.shares, strict=True))
    assert shares["x"] > 0.8, shares  # a parameter server, the LP's choice for one fat link
    assert t.round.voters == ["a", "b"]


def test_an_auxiliary_peer_neither_counts_samples_nor_votes_nor_is_resynced(clock):
    t = with_auxiliary(clock, "x")
    assert not sent(t.handle("x", Progress(0, 10**6, 1e6, upload=100 * MBIT)), RoundStart)
    start = open_round(t, {"a": 50, "b": 50})
    # Its word on the state moves nothing: the round settles on the voters' hashes alone.
    outs = t.handle("x", RoundDone(start.round_id, 0, True, "f" * 64, numel=10, received={"a": 50, "b": 50}))
    assert t.epoch == 0
    for p in "ab":
        outs += t.handle(p, done(start, numel=1000))
    assert (t.epoch, t.state_sha256) == (1, "h1")
    assert not [to for to, _ in sent(outs, Resync) if to == "x"]
    assert t.peers["x"].proven and t.peers["x"].strikes == 0


def test_a_settled_round_credits_the_auxiliary_peer_with_the_bytes_it_aggregated(clock):
    t = with_auxiliary(clock, "x", compression="uint8")
    start = open_round(t, {"a": 50, "b": 50})
    numel = 100_000
    outs = t.handle("x", aux_done(start))
    for p in "ab":
        outs += t.handle(p, done(start, numel=numel, received={"a": 50, "b": 50}))
    (record,) = [o for o in outs if isinstance(o, RecordCredits)]
    part = part_sizes(numel, start.shares)[start.group.index("x")]
    assert record.credits["x"].aggregated_bytes == 2 * encoded_size(part, "uint8")
    assert record.credits["x"].samples == 0
    assert {record.credits[p].samples for p in "ab"} == {50}


def test_the_round_waits_for_the_auxiliary_reducers_report_before_crediting(clock):
    t = with_auxiliary(clock, "x")
    start = open_round(t, {"a": 50, "b": 50})
    outs = []
    for p in "ab":
        outs += t.handle(p, done(start, numel=1000, received={"a": 50, "b": 50}))
    assert t.epoch == 1 and t.round is not None, "settled, but open for the auxiliary member's report"
    assert not [o for o in outs if isinstance(o, RecordCredits)]
    outs = t.handle("x", aux_done(start))
    assert t.round is None and [o for o in outs if isinstance(o, RecordCredits)]


def test_unproven_auxiliary_peers_get_one_trial_round_in_ten_of_the_time(clock):
    """Identities that come as auxiliary peers and stall: one reduces in a trial round, the
    round fails at its deadline, it is struck; the next trial comes only after nine times as
    long as that round took (and the pause after it), twice that since it failed: stalled
    trials cost at most a tenth of the time, and ever less."""
    t = with_auxiliary(clock, "x", "y", "z")
    start = open_round(t, {"a": 50, "b": 50})
    (trial,) = start.auxiliary
    opened = clock.now
    clock.now += start.timeout  # the trainers give up on its results at their deadline
    for p in "ab":
        t.handle(p, done(start, ok=False, waiting=[trial]))
    assert t.round is not None, "it waits for the auxiliary member's report until the deadline"
    clock.now += 0.3
    t.tick()
    assert t.round is None and t.peers[trial].strikes == 1
    closed = clock.now
    wait = (TRIAL_SPACING - 1) * (closed - opened + t.scheduler.retry_delay) * 2

    def next_round(epoch: int) -> RoundStart:
        clock.now += 1  # (and a second of computing in open_round)
        for p in ("x", "y", "z"):
            t.handle(p, Progress(epoch, 0, 0.0, upload=100 * MBIT, download=100 * MBIT))
        return open_round(t, {"a": 60, "b": 60})

    for epoch in range(3):  # rounds of the trainers alone meanwhile
        again = next_round(epoch)
        assert again.auxiliary == [], clock.now - closed
        for p in "ab":
            t.handle(p, done(again, digest=f"h{epoch + 1}"))
        assert t.epoch == epoch + 1
        clock.now = closed + wait - 3
    clock.now = closed + wait
    assert len(next_round(3).auxiliary) == 1


def settled_rounds(t, clock, took: float, count: int = 3) -> None:
    """``count`` rounds of the trainers alone, each settled ``took`` seconds after it opened."""
    for _ in range(count):
        start = open_round(t, {"a": 60, "b": 60})
        assert start.auxiliary == []
        clock.now += took
        for p in "ab":
            t.handle(p, done(start, digest=f"h{t.epoch + 1}"))
        assert t.round is None


def test_a_trial_round_may_take_ten_times_what_rounds_take_not_the_whole_timeout(clock):
    """A stranger that comes as an auxiliary peer and withholds its results stalls its trial
    round for ten times a typical round (at least a second), as the backbone timed them:
    not for the project's whole round timeout."""
    t = ready_tracker(clock, peers=("a", "b"), round_timeout=30)
    settled_rounds(t, clock, took=0.05)
    t.join("x", "x", PeerRole.AUXILIARY)
    t.handle("x", Progress(t.epoch, 0, 0.0, upload=100 * MBIT, download=100 * MBIT))
    trial = open_round(t, {"a": 60, "b": 60})
    assert trial.auxiliary == ["x"] and trial.timeout == MIN_TRIAL_TIMEOUT
    epoch = t.epoch
    clock.now += trial.timeout + t.round_grace + 0.1
    t.tick()
    assert t.round is None and t.epoch == epoch, "the stalled trial failed at its own deadline"
    assert t.peers["x"].strikes == 1


def test_a_trial_timeout_follows_the_rounds_lately_within_the_projects():
    trials = Trials(clock=lambda: 0.0, retry_delay=1.0)
    assert trials.timeout(30) == 30, "before any round settled: nothing to judge by"
    for took in (0.5, 0.4, 0.6, 20.0):  # (one slow round moves the median little)
        trials.round_over(opened_at=0.0, settled_at=took, trial=False)
    assert trials.timeout(30) == TRIAL_TIMEOUT_FACTOR * 0.55
    trials.round_over(opened_at=0.0, settled_at=None, trial=False)  # a failed round tells nothing
    assert trials.timeout(30) == TRIAL_TIMEOUT_FACTOR * 0.55
    for _ in range(RECENT_ROUNDS):
        trials.round_over(opened_at=0.0, settled_at=9.0, trial=False)
    assert trials.timeout(30) == 30, "never longer than the project's timeout"


def test_an_auxiliary_reducer_that_withholds_its_results_is_struck_then_sits_rounds_out(clock):
    t = with_auxiliary(clock, "x")
    for attempt in range(2):
        if attempt:  # proven again, as after a round it reduced in settled
            t.peers["x"].proven = True
            clock.now += 2
        start = open_round(t, {"a": 50, "b": 50})
        assert start.auxiliary == ["x"]
        t.handle("x", aux_done(start))  # it says it is done; the trainers never got its results
        for p in "ab":
            t.handle(p, done(start, ok=False, waiting=["x"]))
        assert t.round is None and t.peers["x"].strikes == attempt + 1
    assert t.peers["x"].excluded_until > clock.now
    clock.now += 2
    assert open_round(t, {"a": 60, "b": 60}).auxiliary == []


def test_an_auxiliary_reducer_that_names_a_sender_it_missed_is_not_struck(clock):
    t = with_auxiliary(clock, "x")
    start = open_round(t, {"a": 50, "b": 50})
    t.handle("x", RoundDone(start.round_id, 0, False, None, error="no part from b", unreachable=["b"]))
    for p in "ab":
        t.handle(p, done(start, ok=False, waiting=["x"]))
    assert t.peers["x"].strikes == 0
    assert not t.pairs.reachable("x", "b", clock.now)


def test_a_lost_reducers_part_goes_to_a_trainer_never_to_an_auxiliary_peer(clock):
    """An auxiliary member is done once its own parts are, which the backbone cannot see
    before it reports: handed a part then, it would never reduce it."""
    t = with_auxiliary(clock, "x", links={"x": 30 * MBIT})
    start = open_round(t, {"a": 50, "b": 50})
    ((_, msg),) = sent(t.leave("a"), Reassign)[:1]
    assert msg.reducers[start.group.index("a")] == "b"


def test_an_honest_auxiliary_peer_that_names_a_missing_sender_before_the_deadline_is_not_struck(clock):
    """A trainer dies mid-round without its socket closing: the auxiliary member waits for
    its part, gives up first and names it; the other trainer waited for the auxiliary
    member's result, but one voter's word strikes nobody."""
    t = with_auxiliary(clock, "x")
    start = open_round(t, {"a": 50, "b": 50})
    clock.now += 0.8 * start.timeout
    t.handle("x", RoundDone(start.round_id, 0, False, None, error="no part from b", unreachable=["b"]))
    clock.now += 0.2 * start.timeout
    for p in "ab":
        t.handle(p, done(start, ok=False, waiting=["x"]))
    assert t.round is None and t.peers["x"].strikes == 0


def test_a_proven_auxiliary_peer_that_never_reports_holds_a_settled_round_only_a_grace(clock):
    t = with_auxiliary(clock, "x")
    t.peers["x"].proven = True
    start = open_round(t, {"a": 50, "b": 50})
    for p in "ab":
        t.handle(p, done(start, numel=1000))
    assert t.epoch == 1 and t.round is not None
    clock.now += REPORT_GRACE + 0.1
    outs = t.tick()
    assert t.round is None and t.peers["x"].strikes == 1
    (record,) = [o for o in outs if isinstance(o, RecordCredits)]
    assert "x" not in record.credits and set(record.credits) == {"a", "b"}


def test_an_auxiliary_peers_report_does_not_time_the_trainers_credit(clock):
    """Its outcome may come at once; the trainers' claims are judged up to the first
    voter's success."""
    t = with_auxiliary(clock, "x")
    start = open_round(t, {"a": 50, "b": 50})
    t.handle("x", aux_done(start))
    assert t.round.first_success_at is None


def test_an_auxiliary_peer_behind_a_relay_only_is_left_out(clock):
    t = with_auxiliary(clock, "x")
    t.handle("x", Progress(0, 0, 0.0, client_mode=True, upload=100 * MBIT, download=100 * MBIT))
    assert open_round(t, {"a": 50, "b": 50}).auxiliary == []
