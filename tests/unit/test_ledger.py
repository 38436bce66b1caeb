from engine.backbone.ledger import SPEED_UP, TOLERANCE, Claim, credits


def claim(reported=100, rate=10.0, step=8, unreported=1.0, compute=9.0, accumulating=10.0):
    """A member that reported ``reported`` samples at ``rate``, ``step`` per micro-batch."""
    return Claim(reported, rate, step, unreported, compute, accumulating)


def test_honest_members_get_exactly_what_reducers_confirmed():
    out = credits({"a": 112, "b": 40}, {"a": claim(), "b": claim(reported=36, rate=3.6)})
    assert (out["a"].samples, out["b"].samples) == (112, 40)


def test_a_claim_ten_times_the_measured_pace_is_cut_to_the_plausible_amount():
    honest = claim(reported=100, rate=10.0, step=8, unreported=1.0)
    out = credits({"cheat": 1180}, {"cheat": honest})
    plausible = TOLERANCE * (100 + 8 + 10.0 * 1.0)
    assert out["cheat"].samples <= plausible + 1
    assert out["cheat"].samples < 1180 / 5


def test_unconfirmed_members_and_empty_contributions_get_nothing():
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
