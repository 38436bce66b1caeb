"""Pure functions that keep a reducer's aggregate in the honest peers' hands.

A reducer holds, for its part of the vector, one contribution per sender: a gradient *sum*
(the sender's per-sample gradient times the samples it claims) and that sample count. A
claim only weighs, it is not trusted, and values are checked before they count:

- values must be finite, or the sender is left out;
- a claimed sample count weighs at most the sender's cap -- what the backbone saw it
  compute for this round (``RoundStart.caps``) -- and the project's share of the target
  batch, if it sets one; a claim of more than OVER_CAP times its cap is a lie, and the part
  is left out (a part claiming 10^12 samples, with values scaled to match, looks like an
  honest gradient per sample, and must not come in at all);
- a sender whose per-sample gradient is longer, or shorter, than ``max_norm_ratio`` times
  the median of the round's (the reducer's own among them), allowing for the noise its
  sample count leaves, is left out; with fewer than three parts, one far from the
  reducer's own is set aside (kept out, its sender not blamed); without an own part that
  passed, two parts judge each other (both set aside if they disagree), and if the reducer
  brought no samples a lone part, which nothing can judge, is set aside -- unless it is an
  auxiliary reducer beside one proven trainer, whose own the part is.

What passed is averaged by weight -- or, with ``centered_clip`` (Karimireddy, He, Jaggi
2021; the aggregator of BTARD), pulled toward the honest majority: each contribution's
distance from the estimate is clipped to a radius before it moves it, so a minority far
away moves it by at most that radius. Every operation runs in a fixed order in fp32, so a
reducer, and anyone checking it, computes the same bits from the same inputs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from engine.project import AggregationSpec
from engine.wire.types import MAX_COUNT

BLOCK = 1 << 14  # below torch's grain size: each block's sum runs on one thread
# A claim this far past the backbone's cap is no honest peer's: the cap already allows
# for jitter and a micro-batch or two.
OVER_CAP = 4


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
    set_aside: dict[str, str] = field(default_factory=dict)  # the same, on the reducer's word alone


def norm(values: torch.Tensor) -> float:
    """The Euclidean length, the same to the bit however many threads torch uses (its own
    reduction splits the work by thread count, and sums in a different order)."""
    n = values.numel()
    full = n - n % BLOCK
    squares = torch.linalg.vector_norm(values[:full].view(-1, BLOCK), dim=1).double().square().tolist()
    if full < n:
        squares.append(float(torch.linalg.vector_norm(values[full:])) ** 2)
    return math.sqrt(math.fsum(squares))


def screen(contributions: Sequence[Contribution], caps: Mapping[str, int], max_samples: int,
           max_norm_ratio: float, reference: str | None = None) -> Screened:
    """Check each contribution; weigh what passes by its claimed sample count, capped.
    With fewer than three parts no majority says what an honest length is: then the part
    of ``reference`` (the reducer's own) judges the other, which is set aside, not
    rejected, if it is far off: a stranger alone in a round with one member cannot poison
    it, and a reducer cannot have a member struck on its word alone. Without an own part
    that passed, two parts judge each other; a reducer that brought no samples (it finished
    no micro-batch yet, or reduces only) sets a lone part aside: one sender's word alone
    never moves the model (the round is redone once the reducer has computed). One whose
    own part failed its own checks is the one at fault: a lone part beside it is not held
    hostage to it. ``reference`` None: an auxiliary reducer beside one proven trainer, whose
    part it takes."""
    out = Screened()
    candidates: list[tuple[Contribution, float]] = []  # with its per-sample gradient's length
    for c in contributions:
        cap = caps.get(c.sender)
        if c.samples <= 0:
            out.rejected[c.sender] = "no samples"
            continue
        if cap is not None and c.samples > OVER_CAP * cap:
            out.rejected[c.sender] = f"a claim of {c.samples} samples, more than {OVER_CAP}x its cap of {cap}"
            continue
        length = norm(c.values)  # NaN or inf if any value is
        if not math.isfinite(length):
            out.rejected[c.sender] = "values that are not finite"
            continue
        candidates.append((c, length / c.samples))
    judged, median, typical = candidates, 0.0, 1.0
    if len(candidates) >= 3:
        median = statistics.median(length for _, length in candidates)
        typical = statistics.median(c.samples for c, _ in candidates)
    else:
        own = [(c, length) for c, length in candidates if c.sender == reference]
        judged = [(c, length) for c, length in candidates if own and c.sender != reference]
        if own:
            median, typical = own[0][1], own[0][0].samples
        elif reference is not None and len(candidates) == 2:
            _mutually_judged(candidates, max_norm_ratio, out)
        elif reference is not None and candidates and not _brought(contributions, reference):
            out.set_aside[candidates[0][0].sender] = "a lone part, nothing of the reducer's to judge by"
    for c, length in judged:
        # Fewer samples average out less noise: an honest per-sample gradient of b samples
        # may be up to sqrt(typical / b) times longer (or, from more samples, shorter).
        # Too short is as telling as too long: a sample count inflated past the work
        # behind it shrinks the per-sample gradient toward zero.
        noise = math.sqrt(typical / c.samples)
        low, high = median / max_norm_ratio * min(noise, 1.0), median * max_norm_ratio * max(noise, 1.0)
        if not low <= length <= high:
            ratio = length / median if median > 0 else math.inf
            if len(candidates) >= 3:
                out.rejected[c.sender] = f"a gradient {ratio:.3g}x as long as the median"
            else:
                out.set_aside[c.sender] = f"a gradient {ratio:.3g}x as long as the reducer's own"
    for c, _ in candidates:
        if c.sender not in out.rejected and c.sender not in out.set_aside:
            out.senders.append(c.sender)
            out.sums.append(c.values)
            out.scales.append(1.0 / c.samples)
            out.weights.append(min(c.samples, caps.get(c.sender, c.samples), max_samples))
    return out


def _brought(contributions: Sequence[Contribution], reducer: str) -> bool:
    """Whether the reducer brought samples of its own (whether or not its part passed)."""
    return any(c.sender == reducer and c.samples > 0 for c in contributions)


def _mutually_judged(pair: list[tuple[Contribution, float]], max_norm_ratio: float, out: Screened) -> None:
    """Two parts and no third to say which is right: both come in if each is within the
    bounds the other would set as a reducer's own part (the one from fewer samples may be
    longer by their noise), else both are set aside."""
    (small, length_small), (big, length_big) = sorted(pair, key=lambda p: p[0].samples)
    noise = math.sqrt(big.samples / small.samples)
    if not length_small / (max_norm_ratio * noise) <= length_big <= length_small * max_norm_ratio:
        for c in (small, big):
            out.set_aside[c.sender] = "two parts that disagree, and none of the reducer's own to say which"


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
    set_aside: dict[str, str] = field(default_factory=dict)  # (Screened.set_aside)


def aggregate(contributions: Sequence[Contribution], spec: AggregationSpec, target_batch_size: int,
              caps: Mapping[str, int] | None = None, reference: str | None = None) -> Aggregate:
    """Check the contributions and combine what passed; ValueError if nothing did.
    ``caps``: the most samples each sender's part weighs (RoundStart.caps); none given, a
    claim weighs in full (up to the project's share, if it sets one). ``reference``: the
    reducer (see ``screen``)."""
    share = spec.max_sample_share
    max_samples = max(int(share * target_batch_size), 1) if share is not None else MAX_COUNT
    screened = screen(contributions, caps or {}, max_samples, spec.max_norm_ratio, reference)
    if spec.method == "centered_clip" and len(screened.sums) > 1:
        values = centered_clip(screened, spec.clip_radius, spec.clip_iterations)
    else:
        values = weighted_mean(screened)
    return Aggregate(values, dict(zip(screened.senders, screened.weights, strict=True)), screened.rejected,
                     screened.set_aside)


def typical_loss(losses: Mapping[str, float]) -> float | None:
    """The loss a part's senders report, as one number for the learning curve: the median
    of their per-sample losses (the lower of the two middle ones), so that a minority
    cannot put a number on the curve that no honest sender reported."""
    return statistics.median_low(losses[s] for s in sorted(losses)) if losses else None
