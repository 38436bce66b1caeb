"""The tensor work of a round, apart from its protocol (engine/averaging/allreduce.py):
our flat vector cut into the round's parts and the averaged vector results land in
(TensorPartContainer), one part's reduction (TensorPartReducer), and what a round amounts
to (``outcome``). Pure: no network, no event loop; the protocol runs the heavy calls on a
thread so the links keep being served."""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field

import torch

from engine.averaging import compression
from engine.averaging.recheck import part_digest, result_digest
from engine.averaging.robust import Aggregate, Contribution, aggregate, typical_loss
from engine.averaging.round_plan import RoundPlan
from engine.averaging.seen import seen_by_reducers
from engine.planning.partition import part_bounds
from engine.project import Codec
from engine.wire.commitments import Commitment, Committed, PartInputs
from engine.wire.frames import Result
from engine.wire.types import total_count

log = logging.getLogger(__name__)

CommittedPart = tuple[Committed, torch.Tensor]  # a part as its reducer took it, and its hash
# A sender's part as a reducer received it: values (None: no samples), samples, summed loss.
Received = tuple[torch.Tensor | None, int, float]


@dataclass
class Reduced:
    """The part this peer reduced, kept until its round settles in case it is checked."""

    round_id: int
    index: int
    inputs: list[CommittedPart]
    result: torch.Tensor


@dataclass
class Averaged:
    vector: torch.Tensor
    samples: int
    loss: float | None
    received: dict[str, int]  # sender -> samples its part to me carried (empty: I reduced nothing)
    commitment: Commitment | None = None  # when the project checks reducers
    reduced: list[Reduced] = field(default_factory=list)  # the same: each part I reduced
    first_sent: float | None = None  # (time.monotonic()) our first part went to its link; None: none did
    # PowerSGD (engine/averaging/powersgd_round.py): the error feedback to keep if, and only
    # if, this step is taken; the average Q of each matrix, by parameter index, the state
    # carries to the next round's Q0 (the same bits on every member); and the length of
    # each phase's vector (RoundDone.phase_numel).
    residual: torch.Tensor | None = None
    next_q: dict[int, torch.Tensor] = field(default_factory=dict)
    phase_numel: list[int] = field(default_factory=list)


@dataclass
class ReducedParts:
    """What an auxiliary member did in a round: it reduced parts and applied nothing."""

    results: list[Result]  # one per part it reduced
    received: dict[str, int]  # sender -> samples its parts to me carried
    commitment: Commitment | None = None
    reduced: list[Reduced] = field(default_factory=list)
    bytes_in: int = 0  # payload bytes of the parts it combined
    phase_numel: list[int] = field(default_factory=list)  # PowerSGD: each phase's vector length


def decode_values(payload: bytes | bytearray | memoryview, expected: int,
                  method: Codec) -> torch.Tensor | None:
    """The fp32 values a part or result carries (None: an empty part); ValueError if the
    payload is not ``expected`` values in ``method``."""
    if len(payload) == 0:
        return None
    if method != "none":
        return compression.decode(payload, expected, method)
    if len(payload) != expected * 4:
        raise ValueError(f"{len(payload)} bytes, expected {expected * 4}")
    return torch.frombuffer(payload, dtype=torch.float32)


class TensorPartContainer:
    """Our side of the round's vector: each part as it travels, the averaged vector the
    results land in, and (in a checked project) the hashes we commit to per part."""

    def __init__(self, plan: RoundPlan, flat: torch.Tensor | None, samples: int, numel: int = 0) -> None:
        self.plan = plan
        self.flat = flat  # our gradient sum (None: an auxiliary member brings none)
        self.samples = samples
        self.numel = flat.numel() if flat is not None else numel
        self.sends = flat is not None
        self.bounds = part_bounds(self.numel, plan.shares, plan.pieces)
        # Every part's result lands here (an auxiliary member applies nothing: it keeps none).
        self.averaged = torch.empty(self.numel if self.sends else 0, dtype=torch.float32)
        self.sent: dict[int, str] = {}  # part index -> hash of ours (if verified)
        self.shown: dict[int, str] = {}  # part index -> its reducer's own, as shown us
        self.applied: dict[int, str] = {}  # part index -> hash of its result

    def size(self, j: int) -> int:
        lo, hi = self.bounds[j]
        return hi - lo

    def member_size(self, m: int) -> int:
        """How many values member ``m`` reduces, in all its pieces."""
        pieces = self.plan.pieces
        return sum(self.size(j) for j in range(m * pieces, (m + 1) * pieces))

    def payload(self, j: int) -> bytes | memoryview:
        """Our part ``j`` as it travels (empty when we bring no samples)."""
        if self.flat is None or self.samples == 0:
            return b""
        lo, hi = self.bounds[j]
        if self.plan.compression == "none":
            return self.flat[lo:hi].numpy().data
        return compression.encode(self.flat[lo:hi], self.plan.compression)

    def commit_sent(self, j: int, payload: bytes | memoryview) -> None:
        """Commit to part ``j`` as its reducer will take it: decoded."""
        self.sent[j] = part_digest(self.samples, self._decoded(payload, self.size(j)) if payload else None)

    def own(self, j: int) -> torch.Tensor | None:
        """Our own values of part ``j``, as its reducer (None: we bring none)."""
        if self.flat is None or self.samples == 0:
            return None
        lo, hi = self.bounds[j]
        return self.flat[lo:hi]

    def own_digest(self, j: int) -> str:
        own = self.own(j)
        return part_digest(self.samples if own is not None else 0, own)

    def land(self, j: int, values: torch.Tensor) -> None:
        """Part ``j``'s result: into the averaged vector, and its hash if we commit."""
        lo, hi = self.bounds[j]
        self.averaged[lo:hi] = values
        if self.plan.verified:
            self.applied[j] = result_digest(values)

    def commitment(self, reduced: list[Reduced]) -> Commitment | None:
        """What we did, for projects that check reducers: the parts we sent and the results
        we applied (by part), and what we combined for each part we reduced."""
        if not self.plan.verified:
            return None
        parts = range(self.plan.parts)
        return Commitment(sent=[self.sent.get(j) for j in parts] if self.sends else [],
                          results=[self.applied.get(j) for j in parts] if self.sends else [],
                          reduced=[PartInputs(index=r.index, inputs=[c for c, _ in r.inputs])
                                   for r in sorted(reduced, key=lambda r: r.index)],
                          shown=[self.shown.get(j) for j in parts] if self.sends else [])

    def _decoded(self, payload: bytes | memoryview, n: int) -> torch.Tensor | memoryview | bytes:
        method = self.plan.compression
        try:
            return payload if method == "none" else compression.decode(payload, n, method)
        except ValueError:
            return payload  # a part that is not finite: its reducer leaves it out, uncommitted


@dataclass
class ReducedPart:
    """One part reduced: its result as it travels, and as everyone applies it."""

    result: Result
    payload: bytes | memoryview
    values: torch.Tensor


class TensorPartReducer:
    """The parts this peer reduces in a round. Senders' parts are added in group order, so
    every reducer handed the same inputs gets the same bits."""

    def __init__(self, plan: RoundPlan) -> None:
        self.plan = plan
        self.mine: list[Result] = []  # my results, one per part I reduced
        self.reduced: list[Reduced] = []  # what I reduced (if verified)

    def reduce(self, j: int, parts: dict[str, Received]) -> ReducedPart:
        """Part ``j`` from the senders' ``parts``; ValueError if there is nothing to reduce
        or the result cannot be encoded."""
        plan = self.plan
        contributions = [Contribution(p, values, samples) for p in plan.group if p in parts
                         for values, samples, _ in [parts[p]] if values is not None]
        try:
            combined, inputs = self.combine(contributions)
        except ValueError as exc:
            raise ValueError(f"no part to reduce ({exc})") from None
        for sender, why in (combined.rejected | combined.set_aside).items():
            log.warning("round %d: leaving out the part of %s: %s", plan.round_id, sender, why)
        for c in contributions:
            if combined.weights.get(c.sender, c.samples) < c.samples:
                log.info("round %d: counting %d of the %d samples %s claims (its cap)", plan.round_id,
                         combined.weights[c.sender], c.samples, c.sender)
        values = combined.values
        payload: bytes | memoryview = values.numpy().data
        codec = plan.result_compression
        if codec != "none":
            # Everyone, this reducer too, applies the result as it travels.
            try:
                payload = compression.encode(values, codec)
            except ValueError as exc:
                raise ValueError(f"result not encodable ({exc})") from None
            values = compression.decode(payload, values.numel(), codec)
        if plan.verified:  # (under the index it travelled with: phases never share one)
            self.reduced.append(Reduced(plan.round_id, plan.wire(j), inputs, values))
        weights = combined.weights
        loss = typical_loss({p: parts[p][2] / parts[p][1] for p in weights})
        # A part with no samples (a slow device that finished no micro-batch) was still
        # delivered: the backbone must see its sender took part, or it strikes it. So was
        # one set aside on this reducer's word alone: it counts for nothing, blames nobody.
        received = {p: 0 for p, (v, _, _) in parts.items() if v is None} | \
            dict.fromkeys(combined.set_aside, 0) | weights
        result = Result(round_id=plan.round_id, epoch=plan.epoch, index=plan.wire(j),
                        samples=total_count(weights.values()), loss=loss, received=received)
        self.mine.append(result)
        return ReducedPart(result, payload, values)

    def combine(self, contributions: list[Contribution]) -> tuple[Aggregate, list[CommittedPart]]:
        """Check and combine; in a checked project, also hash what went in."""
        plan = self.plan
        # An auxiliary reducer beside the one proven trainer takes what comes: that trainer's
        # own gradient is nobody else's to protect (such a round has one voter, and is never
        # checked). Every other reducer judges by its own part, or by the rules without one.
        proven = [s for s in plan.senders if s not in plan.optional]
        judge = None if plan.me in plan.auxiliary and len(proven) <= 1 else plan.me
        combined = aggregate(contributions, plan.aggregation, plan.target_batch_size, plan.caps, judge)
        inputs = [(_committed(c), c.values) for c in contributions] if plan.verified else []
        return combined, inputs

    def seen_in_all(self) -> dict[str, int]:
        """Per sender, the samples its parts to me carried: in every part I reduced (a
        sender that skipped one did not take part in full), the fewest."""
        if not self.mine:
            return {}
        senders = set.intersection(*(set(r.received) for r in self.mine))
        return {s: min(r.received[s] for r in self.mine) for s in sorted(senders)}


def outcome(results: list[Result], parts: TensorPartContainer, reducer: TensorPartReducer) -> Averaged:
    """What the round amounts to. Reducers may have taken different optional parts, and one
    may lie in its header: the round's samples are what reducers holding most of the vector
    saw (the rule the backbone credits by), its loss the median the reducers say, the same
    on every peer handed the same results; ValueError if nobody reduced."""
    if not results:
        raise ValueError("nobody reduced anything")
    plan = parts.plan
    if plan.grouped:  # (a grouped round's results count every group; each lists its own)
        samples = statistics.median_low(r.samples for r in results)
    else:
        # A reducer holding most of the vector decides alone: it counts a sender for no more
        # than the round's cap on it, as honest reducers weigh it.
        reports = {str(i): {s: min(n, plan.caps.get(s, n)) for s, n in r.received.items()}
                   for i, r in enumerate(results)}
        samples = total_count(seen_by_reducers(reports, {str(i): plan.share_of(r.index)
                                                         for i, r in enumerate(results)}).values())
    losses = [r.loss for r in results if r.loss is not None]
    return Averaged(parts.averaged, samples, statistics.median_low(losses) if losses else None,
                    reducer.seen_in_all(), parts.commitment(reducer.reduced), reducer.reduced)


def _committed(c: Contribution) -> Committed:
    return Committed(sender=c.sender, samples=c.samples, sha256=part_digest(c.samples, c.values))
