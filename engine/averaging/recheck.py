"""Checking a reducer after the fact: pure functions, tested without a network.

A reducer could return any average it likes for its part, and every member would apply it
and agree. So every member commits, in its ``round_done``, to what it did -- the hash of
each part it sent, of each result it applied and, as a reducer, of every part it combined
-- and the backbone then draws parts at random to check. The checker receives the
reducer's inputs and its result, makes sure they are the ones committed to (the reducer
cannot pick other inputs once it knows it is checked), and combines the inputs itself.

The result must match to ``TOLERANCE`` of its length rather than to the bit: the checker's
CPU may round differently (fused multiply-adds, vector widths) from the reducer's, and a
deviation that small moves no model. A wrong average is off by far more. In a project that
compresses results, the result may also be off by as much as the compression may move it
(``compression.error_bound``): a reducer can shade its result by no more than that noise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from engine.averaging import compression
from engine.averaging.compression import error_bound
from engine.averaging.robust import Contribution, aggregate, norm
from engine.planning.partition import part_bounds
from engine.project import AggregationSpec, Codec, CompressionMethod, codec_of
from engine.wire.commitments import Committed
from engine.wire.types import total_count

TOLERANCE = 1e-4


def part_digest(samples: int, values: torch.Tensor | memoryview | bytes | None) -> str:
    """The hash a part is committed by: its sample count and its fp32 bytes."""
    digest = hashlib.sha256(samples.to_bytes(8, "little"))
    if values is not None:
        digest.update(values.numpy().data if isinstance(values, torch.Tensor) else values)
    return digest.hexdigest()


def result_digest(values: torch.Tensor | memoryview | bytes) -> str:
    return hashlib.sha256(values.numpy().data if isinstance(values, torch.Tensor) else values).hexdigest()


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str
    result_sha256: str | None = None  # of what the checker computed
    # The reducer never showed its inputs (or its link to the checker failed): nothing was
    # checked, so this says nothing of its result.
    unanswered: bool = False


def recheck(inputs: list[tuple[Committed, torch.Tensor]], result: torch.Tensor, result_sha256: str,
            spec: AggregationSpec, target_batch_size: int,
            compression: CompressionMethod = "none", caps: Mapping[str, int] | None = None,
            reducer: str | None = None, forwarded: Sequence[str | None] = (),
            pieces: Sequence[float] = ()) -> Verdict:
    """Whether ``result`` is what the committed ``inputs`` combine to under ``spec`` at
    ``reducer``, each input's samples counted up to its cap for the round; and, for a
    grouped round's level-1 part, whether the reducer sent that result on, times the
    samples that weighed in it, as the level-2 parts it committed to (``forwarded``)."""
    if result_digest(result) != result_sha256:
        return Verdict(False, "the result it sent is not the one the members applied")
    for committed, values in inputs:
        if values.numel() != result.numel():
            return Verdict(False, f"the part of {committed.sender} has {values.numel()} values, "
                                  f"the result {result.numel()}")
        if part_digest(committed.samples, values) != committed.sha256:
            return Verdict(False, f"the part of {committed.sender} is not the one it committed to")
    contributions = [Contribution(c.sender, values, c.samples) for c, values in inputs]
    try:
        combined = aggregate(contributions, spec, target_batch_size, caps, reducer)
    except ValueError:
        return Verdict(False, "its inputs combine to nothing, yet it sent a result")
    if forwarded and not forwarded_as_committed(result, total_count(combined.weights.values()), forwarded,
                                                pieces, codec_of(compression)):
        return Verdict(False, "the level-2 parts it sent are not its result times the samples that "
                              "weighed in it")
    mine = combined.values
    digest = result_digest(mine)
    off = norm(mine - result)
    allowed = TOLERANCE * norm(mine) + error_bound(mine, compression) * (1 + TOLERANCE) + 1e-30
    if not off <= allowed:  # (a NaN is never within it)
        return Verdict(False, f"its result is {off:.3g} away from the average of its inputs "
                              f"({off / max(norm(mine), 1e-30):.3g} of its length)", digest)
    return Verdict(True, "", digest)


def forwarded_as_committed(result: torch.Tensor, samples: int, forwarded: Sequence[str | None],
                           pieces: Sequence[float], codec: Codec) -> bool:
    """Whether each piece of ``result`` times ``samples``, as it travels, hashes to the
    level-2 part committed for it (an empty piece: to none, or to nothing)."""
    forward = result * samples
    for (lo, hi), committed in zip(part_bounds(result.numel(), pieces), forwarded, strict=True):
        if hi == lo:
            continue
        if part_digest(samples, as_travelling(forward[lo:hi], codec)) != committed:
            return False
    return True


def as_travelling(values: torch.Tensor, codec: Codec) -> torch.Tensor:
    """``values`` as their receiver decodes them."""
    if codec == "none" or values.numel() == 0:
        return values
    return compression.decode(compression.encode(values, codec), values.numel(), codec)
