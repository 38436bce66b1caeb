"""One round as this peer runs it, top to bottom:

1. take     the gradient accumulated since the last step (training/optimizer.py)
2. tell     the backbone what we bring: its last evidence of our pace (peer/progress.py)
3. plan     the round as we take part in it, from its RoundStart (averaging/round_plan.py)
4. exchange our parts out, the others' in (averaging/allreduce.py: the protocol)
5. reduce   and check the parts we reduce (averaging/tensor_parts.py, averaging/robust.py)
6. apply    the averaged gradient with the optimizer's step (training/optimizer.py)
7. report   how it went (RoundDone); the backbone settles the step when the group agrees

A round that fails gives the gradient back to the accumulator: it counts in the next one."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import torch

from engine.averaging.errors import AveragingError
from engine.averaging.round_plan import RoundPlan
from engine.averaging.tensor_parts import Averaged
from engine.peer.progress import ProgressReporter, SendControl
from engine.project import AggregationSpec, CompressionMethod
from engine.training.accumulator import Accumulated
from engine.training.optimizer import CollaborativeOptimizer
from engine.wire.control import RoundDone, RoundStart, Step

log = logging.getLogger(__name__)

Averager = Callable[[RoundPlan, torch.Tensor, int, float, float], Awaitable[Averaged]]
# A round waits for the micro-batch under way only while the rest of it fits in this share
# of the round's timeout; a slower device drops that micro-batch instead of stalling everyone.
ROUND_WAIT_SHARE = 0.2


@dataclass
class Stepped:
    """A round this peer stepped in: the step, what it brought to it, and how soon after
    the RoundStart it held its gradient (the micro-batch under way finished) and its first
    part went to its link (None: it sent none, reducing the whole vector itself)."""

    step: Step
    taken: Accumulated
    mine: int  # the samples the step weighed ours at: what we brought, or our cap if less
    took_seconds: float
    first_byte_seconds: float | None


class RoundPipeline:
    def __init__(self, optimizer: CollaborativeOptimizer, progress: ProgressReporter, average: Averager,
                 send: SendControl, *, me: str, target_batch_size: int,
                 aggregation: AggregationSpec | None = None, compression: CompressionMethod = "none") -> None:
        self.optimizer = optimizer
        self.progress = progress
        self.average = average
        self.send = send
        self.me = me
        self.target_batch_size = target_batch_size
        self.aggregation = aggregation or AggregationSpec()
        self.compression = compression
        self.last_step: RoundDone | None = None  # how our last step went, told the backbone again

    async def run(self, start: RoundStart) -> Stepped | None:
        """Take part in the round ``start``; None if the round failed."""
        if self.me not in start.group:
            return None
        opt = self.optimizer
        arrived = time.monotonic()
        taken = await opt.begin_round(start.epoch, ROUND_WAIT_SHARE * start.timeout)
        if taken is None:
            await self.send(RoundDone(start.round_id, start.epoch, ok=False,
                                      error=f"not ready for epoch {start.epoch}"))
            return None
        try:
            took = time.monotonic()
            await self.progress.report_taken(taken)
            began = time.monotonic()
            try:
                plan = RoundPlan.of(start, self.me, self.aggregation, self.target_batch_size,
                                    self.compression)
                vector, samples, loss_sum = within_cap(plan, taken)
                averaged = await self.average(plan, vector, samples, loss_sum, start.timeout)
                # (PowerSGD: the error feedback it leaves is kept only if the step is taken)
                hashed, proved = await opt.step(averaged.vector, start.epoch, start.nonce,
                                                residual=averaged.residual, next_q=averaged.next_q)
                self.progress.stepped()  # (the next epoch's micro-batches run from here)
            except AveragingError as exc:
                log.warning("round for epoch %d failed: %s", start.epoch, exc)
                await opt.give_back(taken, start.epoch)
                await self.send(RoundDone(start.round_id, start.epoch, ok=False, error=str(exc),
                                          unreachable=exc.suspects, waiting=exc.waiting))
                return None
            opt.keep_taken(start.epoch, taken)
            digest = await asyncio.wrap_future(hashed)  # (computed while micro-batches resumed)
            proof = await asyncio.wrap_future(proved)
        finally:
            opt.end_round()
            self.progress.round_ended()
        seconds = time.monotonic() - began
        self.last_step = RoundDone(start.round_id, start.epoch, ok=True, state_sha256=digest,
                                   samples=averaged.samples, loss=averaged.loss, seconds=seconds,
                                   received=averaged.received, commitment=averaged.commitment,
                                   numel=averaged.vector.numel(), phase_numel=averaged.phase_numel,
                                   proof=proof)
        await self.send(self.last_step)
        step = Step(epoch=start.epoch + 1, round_id=start.round_id, loss=averaged.loss,
                    samples=averaged.samples, peers=len(start.group), round_seconds=seconds,
                    state_sha256=digest)
        first_byte = None if averaged.first_sent is None else averaged.first_sent - arrived
        return Stepped(step, taken, samples, took - arrived, first_byte)


def within_cap(plan: RoundPlan, taken: Accumulated) -> tuple[torch.Tensor, int, float]:
    """What we bring, claimed at most at our cap for the round: the sum scaled to it, which
    weighs it as the reducers would. A newcomer's cap is probation's bound (the typical
    member's pace), not what it computed; a graphics card beside a laptop brings many
    times that, and a claim past four times the cap would be refused as a lie."""
    cap = plan.caps.get(plan.me, 0)
    if not 0 < cap < taken.samples:
        return taken.vector, taken.samples, taken.loss_sum
    log.info("round %d: claiming %d of the %d samples we bring (our cap for the round)", plan.round_id, cap,
             taken.samples)
    scale = cap / taken.samples
    return taken.vector * scale, cap, taken.loss_sum * scale
