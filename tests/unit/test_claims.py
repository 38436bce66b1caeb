"""Every number a peer reports is a claim: the tracker counts it only as far as the time the
peer has been accumulating allows at a plausible pace, and every sum of claims stays a valid
count. Driven directly, with the tracker's clock in the test's hands."""

import math

from engine.averaging.robust import OVER_CAP
from engine.backbone.tracker import Identity, Tracker
from engine.backbone.tracker.membership import MAX_PACE_RATIO, UNREPORTED_SLACK
from engine.wire import control
from engine.wire.codec import encode_text
from engine.wire.control import Progress, Ready, Resync, RoundStart, SyncRequest
from engine.wire.types import MAX_COUNT, MAX_RATE
from tests.unit.tracker_helpers import Clock, done, open_round, project, sent

PEERS = ("a", "b", "c")


def ready_peers(clock, **kw):
    """A collaboration at epoch 0 that PEERS joined, each ready with its state."""
    t = Tracker(project(**kw), clock=clock, state_sha256="h0")
    for p in PEERS:
        t.join(p, p)
        t.handle(p, SyncRequest())
        t.handle(p, Ready(0, "h0"))
    return t


def honest_collaboration(clock, epochs=2, **kw):
    """Three honest peers that settled ``epochs`` rounds, each computing 32 samples a
    second: proven, with measured paces."""
    t = ready_peers(clock, target_batch_size=96, **kw)
    for epoch in range(epochs):
        start = open_round(t, {p: 32 for p in PEERS})
        for p in PEERS:
            t.handle(p, done(start, digest=f"h{epoch + 1}"))
        assert t.epoch == epoch + 1
    assert all(t.peers[p].proven for p in PEERS)
    return t


def stranger(t, name="mallory", **identity):
    t.join(name, name, identity=Identity(**identity) if identity else None)
    t.handle(name, SyncRequest())
    t.handle(name, Ready(t.epoch, t.state_sha256))
    return t.peers[name]


def test_ready_then_progress_forges_no_pace_and_no_samples():
    """Before: a Ready reset the peer's tally, and a Progress a microsecond later gave it a
    pace of samples per microsecond: 720,049 samples credited in 4 rounds."""
    clock = Clock()
    t = honest_collaboration(clock)
    mallory = stranger(t)
    for _ in range(20):
        t.handle("mallory", Ready(t.epoch, t.state_sha256))  # resets nothing now
        clock.now += 1e-6
        t.handle("mallory", Progress(t.epoch, 10**6, 1e6, compute_seconds=0.0))
    typical = t.members.typical()[0]
    assert typical < 100
    slack = 2 * t.members.typical()[1] + math.ceil(1.5 * typical * UNREPORTED_SLACK) + 1
    assert mallory.samples <= slack  # no time has passed: no more than the slack
    assert mallory.rate <= typical  # on probation: at most the typical pace
    clock.now += 2.0
    t.handle("mallory", Progress(t.epoch, 10**6, 1e6))
    assert mallory.samples <= math.ceil(1.5 * typical * 2.0) + slack


def test_a_proven_peer_counts_as_at_most_sixteen_times_the_typical_member():
    clock = Clock()
    t = honest_collaboration(clock)
    fast = t.peers["a"]
    clock.now += 1.0
    t.handle("a", Progress(t.epoch, 10**9, 1e9))
    typical = t.members.typical()[0]
    elapsed = 1.0 + UNREPORTED_SLACK
    assert fast.samples <= math.ceil(1.5 * MAX_PACE_RATIO * typical * elapsed) + 2 * t.members.typical()[1]


def test_a_rounds_caps_let_honest_peers_whole_and_bound_a_stranger():
    clock = Clock()
    t = honest_collaboration(clock)
    stranger(t)
    start = open_round(t, {"mallory": 10**12, "a": 32, "b": 32, "c": 32})
    caps = dict(zip(start.group, start.caps, strict=True))
    assert all(caps[p] >= 32 for p in PEERS), caps
    assert caps["mallory"] <= 2 * max(caps[p] for p in PEERS), caps
    assert start.nonce and len(start.nonce) == 64


def test_a_newcomer_held_at_a_micro_batch_weighs_at_most_one_more():
    """Told its samples do not count yet, an honest newcomer holds at one micro-batch and
    brings at most one more. Its cap by time grows while it idles: before, a claim of ten
    times its one micro-batch fitted four times that cap, and weighed (credited 2,320 of
    232 samples in tests/collab/test_ledger.py)."""
    clock = Clock()
    t = honest_collaboration(clock)
    stranger(t)
    clock.now += 5.0  # held: idle since its first micro-batch
    start = open_round(t, {"mallory": 32, "a": 32, "b": 32, "c": 32})
    caps = dict(zip(start.group, start.caps, strict=True))
    assert caps["mallory"] == 2 * 32 and OVER_CAP * caps["mallory"] < 10 * 32, caps
    assert all(caps[p] >= 32 for p in PEERS), caps
    assert not t.status_for("mallory").counts_you and t.status_for("a").counts_you


def test_sums_of_valid_claims_stay_valid_counts():
    """Before: two Sybils reporting 10^15 samples each made the status a message the peers'
    own codec refused, and GET /api/projects a body the app could not read."""
    clock = Clock()
    t = Tracker(project(target_batch_size=10**15), clock=clock, state_sha256="h0")
    for name in ("s1", "s2", "s3"):
        stranger(t, name)
        clock.now += 1.0
        t.handle(name, Progress(0, 10**15, 1e15))
    status = t.status()
    assert status.samples <= MAX_COUNT and status.samples_per_second <= MAX_RATE
    assert control.from_backbone.decode(encode_text(status)) == status


def test_a_repeated_ready_does_not_restart_the_clock_its_claims_are_judged_by():
    clock = Clock()
    t = honest_collaboration(clock)
    since = t.peers["a"].accumulating_since
    clock.now += 5
    t.handle("a", Ready(t.epoch, t.state_sha256))
    assert t.peers["a"].accumulating_since == since


def test_punishment_outlives_a_reconnect_of_the_same_peer_account_or_address():
    """Before: a peer that reconnected with the same id and token got a fresh member state:
    an hour of exclusion and its strikes, gone."""
    clock = Clock()
    t = honest_collaboration(clock)
    liar = stranger(t, "liar", account=7, address_group="2001:db8:1:2::/64")
    t.members.expel(liar, "caught")
    t.leave("liar")
    again = stranger(t, "liar")
    assert again.excluded_until > clock.now + 3000 and again.strikes == 1
    t.leave("liar")
    same_user = stranger(t, "liar-2", account=7)
    same_net = stranger(t, "liar-3", address_group="2001:db8:1:2::/64")
    assert same_user.excluded_until > clock.now + 3000 and same_user.strikes == 1
    assert same_net.excluded_until > clock.now + 3000 and same_net.strikes == 0
    other = stranger(t, "neighbour", address_group="2001:db8:1:3::/64")
    assert other.excluded_until == 0


def test_strikes_and_probation_survive_a_reconnect_but_not_another_users_address():
    clock = Clock()
    t = honest_collaboration(clock)
    peer = stranger(t, "flaky", account=3, address_group="198.51.100.7")
    t.members.strike(peer, "missed a round")
    t.members.strike(peer, "missed another")
    t.members.reduce_nothing(peer, "hid its inputs")
    t.leave("flaky")
    back = stranger(t, "flaky", account=3, address_group="198.51.100.7")
    assert back.strikes == 2 and back.excluded_until > clock.now and back.sends_only_until > clock.now
    assert not back.proven
    neighbour = stranger(t, "neighbour", address_group="198.51.100.7")  # one NAT, many users
    assert neighbour.strikes == 0 and neighbour.excluded_until == 0


def test_a_proven_peer_that_reconnects_stays_proven():
    clock = Clock()
    t = honest_collaboration(clock)
    t.leave("a")
    t.join("a", "a")
    assert t.peers["a"].proven


def test_a_late_outcome_that_echoes_the_broadcast_hash_proves_nothing():
    """Before: a member on probation became proven by a late RoundDone that repeated the hash
    of the Step broadcast, holding no state. The proof is over values of the state that the
    round's nonce picks."""
    clock = Clock()
    t = honest_collaboration(clock)
    stranger(t)
    start = open_round(t, {"mallory": 32, "a": 32, "b": 32, "c": 32})
    assert "mallory" in start.optional
    for p in PEERS:
        t.handle(p, done(start, digest="h3", proof="p" * 64,
                         received={"a": 32, "b": 32, "c": 32, "mallory": 32}))
    assert t.epoch == 3
    t.handle("mallory", done(start, digest="h3", proof="e" * 64))
    assert not t.peers["mallory"].proven
    assert t.peers["mallory"].strikes == 1  # it reported a state it does not hold


def test_a_voter_without_the_proof_votes_for_another_state():
    clock = Clock()
    t = honest_collaboration(clock)
    start = open_round(t, {p: 32 for p in PEERS})
    t.handle("a", done(start, digest="h3", proof="p" * 64))
    t.handle("b", done(start, digest="h3", proof="x" * 64))
    assert t.epoch == 2, "two voters of three do not agree on one state and proof"
    t.handle("c", done(start, digest="h3", proof="p" * 64))
    assert t.epoch == 3 and t.peers["b"].strikes == 1


def test_a_peer_back_at_its_kept_state_keeps_the_time_it_accumulated_over():
    """After a round is discarded, members go back to the state they kept, with the gradient
    they brought still in their accumulator: their claims are judged over the time they
    computed it, not from their Ready (CI saw honest peers' parts left out as lies)."""
    clock = Clock()
    t = honest_collaboration(clock)
    since = t.peers["a"].accumulating_since
    start = open_round(t, {p: 32 for p in PEERS})
    resynced = []
    for p in PEERS:  # three different states: no majority, the round is discarded
        resynced += sent(t.handle(p, done(start, digest=f"h-{p}")), Resync)
    assert t.round is None and "a" in {to for to, _ in resynced}
    clock.now += 2
    t.handle("a", Ready(t.epoch, t.state_sha256))
    assert t.peers["a"].accumulating_since == since
    t.handle("a", Progress(t.epoch, 64, 32.0))
    assert t.peers["a"].samples == 64


def test_a_step_judged_late_leaves_the_samples_computed_meanwhile_within_the_cap():
    """A member goes on computing once it answers; its step is judged when the last voter
    does. Before: its cap counted from the judgement, and CI saw an honest peer weighed and
    credited at 355 of the 480 samples it had computed since answering."""
    clock = Clock()
    t = honest_collaboration(clock)
    start = open_round(t, {p: 32 for p in PEERS})
    t.handle("a", done(start, digest="h3"))
    clock.now += 5.0  # "b" and "c" are slow to answer; "a" computes 32 samples a second
    for p in ("b", "c"):
        t.handle(p, done(start, digest="h3"))
    assert t.epoch == 3
    start = open_round(t, {"b": 48, "c": 48})  # "a" has not reported since it answered
    caps = dict(zip(start.group, start.caps, strict=True))
    assert caps["a"] >= 32 * 6.0, caps


def test_a_member_whose_first_report_is_still_on_its_way_may_bring_a_micro_batch():
    """The first round can open before a member's first report arrives (the others reached
    the target first) and before anyone's pace is measured. That member still brings the
    micro-batch it finished meanwhile: its cap is two of the others' micro-batches, not
    zero, or its honest part is left out (the large-batch equivalence test caught one)."""
    clock = Clock()
    t = ready_peers(clock, target_batch_size=16)
    start = open_round(t, {"a": 8, "b": 8}, computing=0.01)
    assert "c" in start.group and t.members.typical() == (0.0, 0)  # nobody's pace measured yet
    caps = dict(zip(start.group, start.caps, strict=True))
    assert caps["c"] == 2 * 8


def test_a_member_whose_first_pace_timed_its_warm_up_counts_what_it_computed_since():
    """A first report times the warm-up too: a member that reported one micro-batch after
    0.23 s (35 samples/s) went on at the others' 150 samples/s, and brought 48 samples to a
    round that opened 0.06 s after its report. Its cap (1.5 x (8 + 35 x 0.31) + 16 = 44)
    cut its honest part (the large-batch equivalence test caught it in CI)."""
    clock = Clock()
    t = ready_peers(clock, target_batch_size=96)
    clock.now += 0.23
    t.handle("c", Progress(0, 8, 35.0))
    clock.now += 0.06
    outs = t.handle("a", Progress(0, 40, 150.0)) + t.handle("b", Progress(0, 56, 150.0))
    starts = [m for _, m in sent(outs, RoundStart)]
    caps = dict(zip(starts[0].group, starts[0].caps, strict=True))
    assert caps["c"] >= 48
    fastest = 56 / 0.29  # the others' paces, as the backbone timed them
    assert caps["c"] <= math.ceil(1.5 * (8 + fastest * (0.06 + UNREPORTED_SLACK))) + 2 * 8, \
        "no more than the others' pace allows"


def test_an_overlapped_member_is_timed_from_when_it_took_its_gradient():
    """Overlapped, a member computes through its round, from the moment it took its
    gradient: the backbone times its next gradient from the round's opening. Timed from its
    answer (as in sync rounds, where it computes nothing meanwhile), a member that computed
    through a 3-s round at 32 samples/s looked 7 times faster than it is."""
    paces = {}
    for overlap in (False, True):
        clock = Clock()
        t = honest_collaboration(clock, overlap=overlap)  # 32 samples/s each
        start = open_round(t, {p: 32 for p in PEERS})
        clock.now += 3.0  # the round averages on slow links
        for p in PEERS:
            t.handle(p, done(start, digest="h3"))
        assert t.epoch == 3
        clock.now += 0.5
        t.handle("a", Progress(t.epoch, 32 * 3 + 16, 32.0))  # what it computed through the round and since
        paces[overlap] = t.peers["a"].pace
        assert t.peers["a"].samples == 32 * 3 + 16, "all of it counts"
    assert paces[True] == 32.0
    assert paces[False] > 6 * 32


def test_members_whose_first_reports_are_on_their_way_count_at_the_pace_measured_so_far():
    """One member reached the target alone (the others' warm-ups were slower), and the
    round opened before the two others' first reports arrived. Each still brought the three
    micro-batches it finished by the RoundStart: their caps follow the pace measured of the
    first member, not a median pulled to zero by the two unmeasured (CI saw both cut to two
    micro-batches, 112 of the 128 samples the round held)."""
    clock = Clock()
    t = ready_peers(clock, target_batch_size=48)
    clock.now += 0.05
    t.handle("a", Progress(0, 8, 160.0))
    clock.now += 0.15
    (_, start), *_ = sent(t.handle("a", Progress(0, 48, 240.0)), RoundStart)
    caps = dict(zip(start.group, start.caps, strict=True))
    assert set(start.group) == set(PEERS)
    pace = t.peers["a"].pace  # 48 samples in 0.2 s
    assert caps["b"] == caps["c"] >= 3 * 8 + 2 * 8
    assert caps["c"] <= math.ceil(1.5 * pace * (0.2 + UNREPORTED_SLACK)) + 2 * 8, \
        "no more than a's pace allows"
