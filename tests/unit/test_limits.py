"""The backbone's rate limits, on a controllable clock."""

from engine.backbone.accounts import AttemptLimiter
from engine.backbone.rate_limits import Kind, LimitsConfig, Throttle, kind_of
from engine.ratelimit import Buckets, Rate
from engine.wire.control import Progress, Signal, SignalData, SyncRequest
from engine.wire.types import SignalKind
from tests.unit.tracker_helpers import Clock

SIGNAL = Signal("victim", SignalData(kind=SignalKind.OFFER, conn="c", sdp="v=0"))


def test_a_bucket_allows_its_burst_then_its_rate():
    clock = Clock()
    bucket = Buckets(Rate(2.0, 5.0), clock)
    assert all(bucket.take("k") for _ in range(5)) and not bucket.take("k")
    assert bucket.wait("k") == 0.5
    clock.now += 1.0
    assert bucket.take("k") and bucket.take("k") and not bucket.take("k")
    assert bucket.take("other"), "keys do not share a bucket"


def test_every_message_a_peer_sends_has_a_bucket():
    assert kind_of(SIGNAL) is Kind.SIGNAL and kind_of(SyncRequest()) is Kind.SYNC
    assert kind_of(Progress(0, 1, 1.0)) is Kind.REPORT


def test_an_honest_peer_reporting_twice_a_second_is_never_slowed():
    clock = Clock()
    limits = Throttle(clock=clock)
    for _ in range(3600):
        assert limits.allow("honest", Progress(0, 1, 1.0))
        clock.now += 0.5


def test_a_flooding_peer_is_slowed_then_thrown_out_and_refused_longer_each_time():
    clock = Clock()
    limits = Throttle(LimitsConfig(drops_before_disconnect=10, refuse_for=60.0), clock=clock)
    allowed = sum(limits.allow("mallory", SIGNAL) for _ in range(600))
    assert allowed == LimitsConfig().per_peer[Kind.SIGNAL].burst
    assert limits.should_disconnect("mallory")
    assert limits.disconnected("mallory", "10.0.0.9") == 60.0
    assert limits.refused.retry_after("mallory") == 60.0
    assert limits.refused.retry_after("honest") == 0.0 and limits.allow("honest", SIGNAL)
    clock.now += 61
    assert limits.refused.retry_after("mallory") == 0.0
    assert limits.disconnected("mallory", "10.0.0.9") == 120.0


def test_an_address_whose_peers_keep_flooding_is_refused_new_peers():
    clock = Clock()
    limits = Throttle(LimitsConfig(bans_before_address_refused=3), clock=clock)
    for i in range(2):
        limits.disconnected(f"sybil{i}", "10.0.0.9")
    assert limits.refused.retry_after("10.0.0.9") == 0.0
    limits.disconnected("sybil2", "10.0.0.9")
    assert limits.refused.retry_after("10.0.0.9") > 0
    assert limits.refused.retry_after("10.0.0.10") == 0.0


def test_bursts_far_apart_never_add_up_to_a_disconnect():
    """A long-lived honest peer that now and then sends a burst over its limit stays."""
    clock = Clock()
    limits = Throttle(LimitsConfig(drops_before_disconnect=10), clock=clock)
    for _ in range(20):
        for _ in range(int(LimitsConfig().per_peer[Kind.SIGNAL].burst) + 5):
            limits.allow("honest", SIGNAL)
        assert not limits.should_disconnect("honest")
        clock.now += 120


def test_a_refused_key_quiet_for_the_longest_refusal_starts_over_and_stale_keys_go():
    clock = Clock()
    limits = Throttle(LimitsConfig(refuse_for=60.0, max_refusal=600.0), clock=clock)
    assert [limits.refused.refuse("mallory") for _ in range(3)] == [60.0, 120.0, 240.0]
    clock.now += 240 + 601
    assert limits.refused.refuse("mallory") == 60.0
    for i in range(5000):  # identities a stranger made up, each refused once
        limits.refused.refuse(f"sybil{i}")
    clock.now += 60 + 601
    for i in range(5000):
        limits.refused.refuse(f"later{i}")
    assert len(limits.refused._refused) <= 5001 + 1024


def test_logins_that_succeed_do_not_count_against_a_shared_address():
    """Thirty users behind one NAT log in within a minute; a guesser there is still limited."""
    clock = Clock()
    by_address = AttemptLimiter(limit=30, window=60, clock=clock)
    for _ in range(100):
        assert by_address.attempt("10.0.0.1") == 0
        by_address.uncount("10.0.0.1")
    assert sum(by_address.attempt("10.0.0.1") == 0 for _ in range(40)) == 30
