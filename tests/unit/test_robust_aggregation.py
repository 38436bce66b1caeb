"""A reducer's checks and aggregators, driven directly: what a hostile minority's part can
and cannot do to the average."""

import pytest
import torch

from engine.averaging.robust import Contribution, aggregate, centered_clip, screen, weighted_mean
from engine.project import AggregationSpec

SIZE = 1000


def honest(n: int, samples: int = 32, seed: int = 0) -> list[Contribution]:
    """Gradient sums of ``n`` honest peers: one true gradient plus per-batch noise."""
    torch.manual_seed(seed)
    truth = torch.randn(SIZE)
    return [Contribution(f"honest-{i}", (truth + 0.3 * torch.randn(SIZE)) * samples, samples)
            for i in range(n)]


def truth_of(parts: list[Contribution]) -> torch.Tensor:
    return sum(c.values for c in parts) / sum(c.samples for c in parts)


def run(parts, method="mean", max_samples=64, reducer=None):
    spec = AggregationSpec(method=method, max_sample_share=0.5, max_norm_ratio=10.0, clip_radius=1.0,
                           clip_iterations=20)
    return aggregate(parts, spec, target_batch_size=2 * max_samples, reference=reducer)


def distance(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def test_honest_parts_average_as_before():
    parts = honest(3)
    result = run(parts)
    assert torch.allclose(result.values, truth_of(parts), rtol=1e-5, atol=1e-6)
    assert result.weights == {c.sender: 32 for c in parts} and not result.rejected


def test_the_mean_is_the_large_batch_mean():
    grads = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 6.0])]
    parts = [Contribution(f"p{i}", g * n, n) for i, (g, n) in enumerate(zip(grads, [1, 3], strict=True))]
    assert torch.equal(run(parts).values, torch.tensor([2.5, 5.0]))


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_a_part_that_is_not_finite_is_left_out_and_named(poison):
    parts = honest(3)
    bad = parts[0].values.clone()
    bad[7] = poison
    result = run([*parts, Contribution("mallory", bad, 32)])
    assert "mallory" in result.rejected and "finite" in result.rejected["mallory"]
    assert torch.isfinite(result.values).all()
    assert distance(result.values, truth_of(parts)) < 1e-5


def test_a_claim_of_huge_samples_is_left_out():
    """Before: 10^12 claimed samples divided everyone else's gradient away. Now the
    per-sample gradient such a claim implies is far shorter than anyone's."""
    parts = honest(3)
    claim = Contribution("mallory", parts[0].values.clone(), 10**12)
    result = run([*parts, claim])
    assert "median" in result.rejected["mallory"]
    assert distance(result.values, truth_of(parts)) < 1e-5


def test_a_large_consistent_claim_weighs_no_more_than_the_cap():
    """A peer that did compute a lot (or says so, with values to match) counts for at most a
    share of the target batch: its gradient is weighed, never the whole average."""
    parts = honest(3)
    big = Contribution("big", parts[0].values / 32 * 10**6, 10**6)
    result = run([*parts, big], max_samples=32)
    assert result.weights["big"] == 32 and not result.rejected


def test_a_scaled_gradient_is_left_out_by_the_norm_bound():
    parts = honest(3)
    flipped = Contribution("mallory", parts[0].values * -1e4, 32)  # sign-flipped, scaled
    result = run([*parts, flipped])
    assert "median" in result.rejected["mallory"]
    assert distance(result.values, truth_of(parts)) < 1e-5


def test_an_honest_peer_with_few_samples_is_not_taken_for_an_attacker():
    """One micro-batch against many: its per-sample gradient is noisier, so longer."""
    torch.manual_seed(1)
    truth = torch.randn(SIZE) * 0.01  # late in training: noise dominates the gradient
    parts = [Contribution(f"fast-{i}", (truth + torch.randn(SIZE) / 2000**0.5) * 2000, 2000)
             for i in range(3)]
    slow = Contribution("slow", truth + torch.randn(SIZE), 1)
    result = run([*parts, slow], max_samples=10**6)
    assert not result.rejected


def test_without_a_majority_the_reducers_own_part_sets_a_far_part_aside_and_blames_nobody():
    """Alone in a round with a stranger (the others still starting), a reducer measures the
    stranger's part against its own; a checker, told who reduced, does the same. On one
    member's word, the part is kept out but its sender is not rejected (not struck)."""
    parts = honest(1)
    other = Contribution("other", parts[0].values * -1e4, 32)
    result = run([*parts, other], reducer="honest-0")
    assert not result.rejected and "reducer's own" in result.set_aside["other"]
    assert distance(result.values, truth_of(parts)) < 1e-6
    assert not run(honest(2), reducer="honest-0").set_aside  # an honest second part comes in
    three = run([*honest(2), other], reducer="honest-0")  # a majority: the median judges
    assert "median" in three.rejected["other"] and not three.set_aside


def test_a_reducer_with_no_part_of_its_own_never_takes_one_senders_word_alone():
    """A reducer that finished no micro-batch yet (or an auxiliary one) has nothing to judge
    a lone part by: it is set aside, its sender not blamed -- unless it is an auxiliary
    reducer beside the one proven trainer (no ``reference``). Two parts judge each other."""
    honest_part = honest(1)[0]
    poisoned = Contribution("other", honest_part.values * 100.0, 32)
    for lone in (honest_part, poisoned):
        kept_out = screen([lone], {}, 64, 10.0, reference="reducer")
        assert not kept_out.rejected and "lone part" in kept_out.set_aside[lone.sender]
        with pytest.raises(ValueError, match="nothing to average"):
            run([lone], reducer="reducer")
    alone = run([honest_part], reducer=None)  # the one proven trainer's, at an auxiliary reducer
    assert distance(alone.values, truth_of([honest_part])) < 1e-6 and not alone.set_aside
    agreeing = run(honest(2), reducer="reducer")
    assert not agreeing.set_aside and distance(agreeing.values, truth_of(honest(2))) < 1e-6
    fewer = [honest(2)[0], Contribution("honest-1", honest(2)[1].values / 4, 8)]  # a small batch's noise
    assert not run(fewer, reducer="reducer").set_aside
    disagreeing = screen([honest_part, poisoned], {}, 64, 10.0, reference="reducer")
    assert set(disagreeing.set_aside) == {"honest-0", "other"} and not disagreeing.rejected
    assert not disagreeing.senders


def test_two_parts_judge_each_other_by_the_bounds_a_reducers_own_part_would_set():
    """Only the part from fewer samples may be longer by the noise fewer samples leave."""
    torch.manual_seed(1)
    per_sample = torch.randn(SIZE)
    few, many = 8, 32  # noise allowance sqrt(32 / 8) = 2: up to 20x for the few, 10x for the many

    def pair(few_scale: float, many_scale: float) -> set[str]:
        parts = [Contribution("few", per_sample * few_scale * few, few),
                 Contribution("many", per_sample * many_scale * many, many)]
        return set(screen(parts, {}, 64, 10.0, reference="reducer").set_aside)

    assert pair(15.0, 1.0) == set()  # fifteen times longer from a quarter of the samples: noise
    assert pair(1.0, 15.0) == {"few", "many"}  # from more samples, longer is not noise
    assert pair(1.0, 9.0) == set() and pair(25.0, 1.0) == {"few", "many"}


def test_centered_clip_keeps_noise_within_the_norm_bound_from_moving_the_average():
    """Random noise eight times the honest spread, short enough to pass the norm check: the
    mean moves far, CenteredClip stays with the honest majority."""
    parts = honest(3)
    torch.manual_seed(5)
    spread = float(torch.linalg.vector_norm(parts[0].values / 32 - truth_of(parts)))
    noise = torch.randn(SIZE)
    noise *= 8 * spread / float(torch.linalg.vector_norm(noise))
    hostile = Contribution("mallory", (truth_of(parts) + noise) * 32, 32)
    mean = run([*parts, hostile])
    clipped = run([*parts, hostile], "centered_clip")
    assert not mean.rejected and not clipped.rejected
    assert distance(mean.values, truth_of(parts)) > 5 * distance(clipped.values, truth_of(parts))
    assert distance(clipped.values, truth_of(parts)) < 0.15


def test_centered_clip_of_honest_inputs_is_close_to_their_mean():
    parts = honest(4)
    screened = screen(parts, {}, 64, 10.0)
    clipped = centered_clip(screened, 1.0, 20)
    assert distance(clipped, weighted_mean(screened)) < 0.01


def test_every_reducer_gets_the_same_bits_from_the_same_inputs():
    parts = [*honest(3), Contribution("odd", torch.randn(SIZE) * 500, 32)]
    first = run(parts, "centered_clip").values
    again = run([Contribution(c.sender, c.values.clone(), c.samples) for c in parts],
                "centered_clip").values
    assert torch.equal(first, again)


def test_when_every_part_is_bad_there_is_nothing_to_average():
    nan = torch.full((SIZE,), float("nan"))
    with pytest.raises(ValueError, match="nothing"):
        run([Contribution("a", nan, 1), Contribution("b", nan, 1)])


def test_a_reducer_whose_own_part_fails_its_checks_does_not_hold_the_others_hostage():
    """A cheat running our code: its own claim is past four times its cap, so its part is
    left out; the honest part beside it still comes in (else the cheat's lie would fail
    every round of the honest member)."""
    honest_part = honest(1)[0]
    cheat = Contribution("cheat", honest_part.values * 10, honest_part.samples * 10)
    result = aggregate([honest_part, cheat], AggregationSpec(), 10**9, caps={"cheat": 32}, reference="cheat")
    assert "more than 4x its cap" in result.rejected["cheat"] and result.weights == {"honest-0": 32}
    # Its rejected part switches no check off: two others still judge each other.
    poisoned = Contribution("poisoner", honest_part.values * 100.0, 32)
    both = screen([honest_part, poisoned, cheat], {"cheat": 32}, 10**9, 10.0, reference="cheat")
    assert set(both.set_aside) == {"honest-0", "poisoner"} and not both.senders

