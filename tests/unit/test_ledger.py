from engine.averaging.seen import seen_by_reducers
from engine.backbone.ledger import SPEED_UP, TOLERANCE, Claim, credits


def claim(reported=100, rate=10.0, step=8, unreported=1.0, compute=9.0, accumulating=10.0):
    """A member that reported ``reported`` samples at ``rate``, ``step`` per micro-batch."""
    return Claim(reported, rate, step, unreported, compute, accumulating)


def test_honest_members_get_exactly_what_reducers_saw():
    out = credits({"a": 112, "b": 40}, {"a": claim(), "b": claim(reported=36, rate=3.6)})
    assert (out["a"].samples, out["b"].samples) == (112, 40)


def test_a_claim_ten_times_the_measured_pace_is_cut_to_the_plausible_amount():
    honest = claim(reported=100, rate=10.0, step=8, unreported=1.0)
    out = credits({"cheat": 1180}, {"cheat": honest})
    plausible = TOLERANCE * (100 + 8 + 10.0 * 1.0)
    assert out["cheat"].samples <= plausible + 1
    assert out["cheat"].samples < 1180 / 5


def test_unseen_members_and_empty_contributions_get_nothing():
    out = credits({"a": 0}, {"a": claim(), "b": claim()})
    assert out == {}


def test_compute_time_is_bounded_by_the_time_spent_accumulating():
    out = credits({"a": 100}, {"a": claim(compute=50.0, accumulating=12.0)})
    assert out["a"].compute_seconds == 12.0


def test_a_peer_never_credited_beyond_its_best_throughput_over_the_time_it_accumulated():
    """Even when its reports lag behind: compute time cannot exceed wall-clock time."""
    lagging = Claim(4, 100.0, 4, 0.25, 0.02, accumulating_seconds=0.3, best_throughput=400.0)
    assert credits({"p": 92}, {"p": lagging})["p"].samples == 92
    assert credits({"p": 500}, {"p": lagging})["p"].samples <= SPEED_UP * (400 * 0.3 + 4) + 1


def test_a_sender_is_credited_what_reducers_holding_most_of_the_vector_saw():
    reports = {"r1": {"a": 40, "b": 30}, "r2": {"a": 40, "b": 30}, "r3": {"a": 40, "b": 30}}
    assert seen_by_reducers(reports, {"r1": 1.0, "r2": 1.0, "r3": 1.0}) == {"a": 40, "b": 30}


def test_one_lying_reducer_can_neither_raise_nor_cut_a_senders_credit():
    weights = {"r1": 1.0, "r2": 1.0, "r3": 1.0}
    inflated = {"r1": {"a": 40, "liar": 10**12}, "r2": {"a": 40, "liar": 8}, "r3": {"a": 40, "liar": 8}}
    assert seen_by_reducers(inflated, weights) == {"a": 40, "liar": 8}
    cut = {"r1": {"a": 0}, "r2": {"a": 40}, "r3": {"a": 40}}
    assert seen_by_reducers(cut, weights) == {"a": 40}


def test_what_reducers_report_counts_by_their_share_of_the_vector():
    """A reducer with no share saw no parts: its word carries no weight."""
    reports = {"big": {"a": 40}, "client": {"a": 10**9}}
    assert seen_by_reducers(reports, {"big": 1.0, "client": 0.0}) == {"a": 40}


def test_a_reducer_that_did_not_report_saw_nothing():
    weights = {"r1": 1.0, "r2": 1.0, "r3": 1.0}
    assert seen_by_reducers({"r1": {"a": 40}}, weights) == {}
    assert seen_by_reducers({"r1": {"a": 40}, "r2": {"a": 40}}, weights) == {"a": 40}


def test_a_part_without_samples_is_seen_but_earns_nothing():
    seen = seen_by_reducers({"r1": {"new": 0}, "r2": {"new": 0}}, {"r1": 1.0, "r2": 1.0})
    assert seen == {"new": 0}
    assert credits(seen, {"new": claim()}) == {}
