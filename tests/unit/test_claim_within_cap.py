"""A peer claims at most its cap for the round (engine/peer/round_pipeline.py): scaled to
it, its sum weighs what the reducers would count, and a newcomer far faster than the
members proven so far is never refused as a liar."""

import torch

from engine.averaging.robust import Contribution, aggregate
from engine.averaging.round_plan import RoundPlan
from engine.peer.round_pipeline import within_cap
from engine.project import AggregationSpec
from engine.training.accumulator import Accumulated
from engine.wire.control import RoundStart


def plan(caps: list[int]) -> RoundPlan:
    start = RoundStart(1, 0, ["card", "laptop"], [1.0, 1.0], 30.0, caps=caps)
    return RoundPlan.of(start, "card", AggregationSpec(), 10**9, "none")


def test_a_claim_past_the_cap_is_scaled_to_it_and_counts_as_the_reducers_would():
    torch.manual_seed(0)
    per_sample = torch.randn(1000)
    laptop = Contribution("laptop", (per_sample + 0.1 * torch.randn(1000)) * 40, 40)
    taken = Accumulated(per_sample * 480, 480, 2.5 * 480)  # twelve times the laptop's work
    refused = aggregate([Contribution("card", taken.vector, taken.samples), laptop], AggregationSpec(), 10**9,
                        caps={"card": 60, "laptop": 60})
    assert "more than 4x its cap" in refused.rejected["card"]

    vector, samples, loss_sum = within_cap(plan([60, 60]), taken)
    assert (samples, loss_sum / samples) == (60, 2.5)
    torch.testing.assert_close(vector / samples, per_sample)
    counted = aggregate([Contribution("card", vector, samples), laptop], AggregationSpec(), 10**9,
                        caps={"card": 60, "laptop": 60})
    assert not counted.rejected and counted.weights == {"card": 60, "laptop": 40}


def test_within_the_cap_or_without_one_a_claim_is_what_was_computed():
    taken = Accumulated(torch.ones(10), 8, 4.0)
    for caps in ([8, 8], [100, 1], [0, 0]):
        vector, samples, loss_sum = within_cap(plan(caps), taken)
        assert vector is taken.vector and (samples, loss_sum) == (8, 4.0)
