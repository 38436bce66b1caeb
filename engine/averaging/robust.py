"""Pure functions that keep a reducer's aggregate in the honest peers' hands.

A reducer holds, for its part of the vector, one contribution per sender: a gradient *sum*
(the sender's per-sample gradient times the samples it claims) and that sample count. A
claim only weighs, it is not trusted, and values are checked before they count:

- values must be finite, or the sender is left out;
- a claimed sample count weighs at most ``max_samples`` (a share of the target batch): a
  peer claiming 10^12 samples cannot divide everyone else's gradient away;
- a sender whose per-sample gradient is longer, or shorter, than ``max_norm_ratio`` times
  the median of the round's (the reducer's own among them), allowing for the noise its
  sample count leaves, is left out.

What passed is averaged by weight -- or, with ``centered_clip`` (Karimireddy, He, Jaggi
2021; the aggregator of BTARD), pulled toward the honest majority: each contribution's
distance from the estimate is clipped to a radius before it moves it, so a minority far
away moves it by at most that radius. Every operation runs in a fixed order in fp32, so a
reducer, and anyone checking it, computes the same bits from the same inputs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from engine.project import AggregationSpec

BLOCK = 1 << 14  # below torch's grain size: each block's sum runs on one thread


@dataclass(frozen=True)
class Contribution:
    sender: str
    values: torch.Tensor  # gradient sum: per-sample gradient x samples, fp32, one dimension
    samples: int


@dataclass
class Screened:
    """What a reducer's checks left. Input i stands for the per-sample gradient
    ``sums[i] * scales[i]`` (never materialised: one pass over each sum is the cost)."""

    senders: list[str] = field(default_factory=list)
    sums: list[torch.Tensor] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)  # 1 / claimed samples
    weights: list[int] = field(default_factory=list)  # capped sample counts
    rejected: dict[str, str] = field(default_factory=dict)  # sender -> why it was left out


def norm(values: torch.Tensor) -> float:
    """The Euclidean length, the same to the bit however many threads torch uses (its own
    reduction splits the work by thread count, and sums in a different order)."""
    n = values.numel()
    full = n - n % BLOCK
    squares = torch.linalg.vector_norm(values[:full].view(-1, BLOCK), dim=1).double().square().tolist()
    if full < n:
        squares.append(float(torch.linalg.vector_norm(values[full:])) ** 2)
    return math.sqrt(math.fsum(squares))


def screen(contributions: Sequence[Contribution], max_samples: int, max_norm_ratio: float) -> Screened:
    """Check each contribution; weigh what passes by its capped sample count."""
    out = Screened()
    candidates: list[tuple[Contribution, float]] = []  # with its per-sample gradient's length
    for c in contributions:
        if c.samples <= 0:
            out.rejected[c.sender] = "no samples"
            continue
        length = norm(c.values)  # NaN or inf if any value is
        if not math.isfinite(length):
            out.rejected[c.sender] = "values that are not finite"
            continue
        candidates.append((c, length / c.samples))
    if len(candidates) >= 3:  # with fewer, no majority says what an honest norm is
        median = statistics.median(length for _, length in candidates)
        typical = statistics.median(c.samples for c, _ in candidates)
        for c, length in candidates:
            # Fewer samples average out less noise: an honest per-sample gradient of b samples
            # may be up to sqrt(typical / b) times longer (or, from more samples, shorter).
            # Too short is as telling as too long: a sample count inflated past the work
            # behind it shrinks the per-sample gradient toward zero.
            noise = math.sqrt(typical / c.samples)
            low, high = median / max_norm_ratio * min(noise, 1.0), median * max_norm_ratio * max(noise, 1.0)
            if not low <= length <= high:
                out.rejected[c.sender] = f"a gradient {length / median:.3g}x as long as the median"
    for c, _ in candidates:
        if c.sender not in out.rejected:
            out.senders.append(c.sender)
            out.sums.append(c.values)
            out.scales.append(1.0 / c.samples)
            out.weights.append(min(c.samples, max_samples))
    return out


def weighted_mean(screened: Screened) -> torch.Tensor:
    total = float(sum(screened.weights))
    if not screened.sums or total <= 0:
        raise ValueError("nothing to average")
    out = torch.zeros_like(screened.sums[0], dtype=torch.float32)
    for values, scale, w in zip(screened.sums, screened.scales, screened.weights, strict=True):
        out.add_(values, alpha=scale * w / total)
    return out


def centered_clip(screened: Screened, radius: float, iterations: int) -> torch.Tensor:
    """CenteredClip from the weighted mean. The clipping radius is ``radius`` times the
    median distance of the inputs from the estimate, so it needs no tuning to the
    gradient's scale: honest inputs, near each other, are barely clipped; a far minority is."""
    estimate = weighted_mean(screened)
    total = float(sum(screened.weights))
    away = torch.empty_like(estimate)  # estimate - input
    step = torch.empty_like(estimate)
    inputs = list(zip(screened.sums, screened.scales, screened.weights, strict=True))
    for _ in range(iterations):
        distances = [norm(torch.add(estimate, values, alpha=-scale, out=away)) for values, scale, _ in inputs]
        tau = radius * statistics.median(distances)
        step.zero_()
        for (values, scale, w), distance in zip(inputs, distances, strict=True):
            torch.add(estimate, values, alpha=-scale, out=away)
            clip = 1.0 if distance <= tau else tau / distance
            step.add_(away, alpha=-w * clip / total)
        estimate.add_(step)
        if norm(step) <= 1e-7 * norm(estimate):
            break  # converged (the same test on every machine: the same bits)
    return estimate


@dataclass(frozen=True)
class Aggregate:
    values: torch.Tensor  # the per-sample gradient of this part
    weights: dict[str, int]  # sender -> the samples its contribution weighed
    rejected: dict[str, str]


def aggregate(contributions: Sequence[Contribution], spec: AggregationSpec,
              target_batch_size: int) -> Aggregate:
    """Check the contributions and combine what passed; ValueError if nothing did."""
    share = spec.max_sample_share
    max_samples = max(int(share * target_batch_size), 1) if share is not None else 2**62
    screened = screen(contributions, max_samples, spec.max_norm_ratio)
    if spec.method == "centered_clip" and len(screened.sums) > 1:
        values = centered_clip(screened, spec.clip_radius, spec.clip_iterations)
    else:
        values = weighted_mean(screened)
    return Aggregate(values, dict(zip(screened.senders, screened.weights, strict=True)), screened.rejected)
