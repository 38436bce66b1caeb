"""A PowerSGD round (``compression: powersgd``): two all-reduces through the round's parts.

Phase P moves each member's sketch (M Q0 for every compressed matrix, then the 1-D values)
and phase Q each member's projection (M^T P^) through the same LP-sized shares, the same
reducers and the same protocol as an uncompressed round (engine/averaging/allreduce.py):
the reducers' checks and CenteredClip apply to each part of each phase, each part is
reduced once, and everyone applies its bytes. Between and after the phases every member
computes P^ and the step from those bytes with functions that give the same bits on any
machine (engine/averaging/powersgd.py), so every member applies the same step.

Part j of phase k travels and is committed under index ``k * parts + j``
(RoundPlan.wire): a round's commitment lists phase P's parts, then phase Q's, and the
backbone draws and checks either like any part.

The error feedback is this peer's own: the round returns the residual to keep if, and
only if, the step is taken (``Averaged.residual``); the optimizer keeps the one before
the step beside the state it kept, so a discarded step puts both back. The average Q
goes into the state with the step (``Averaged.next_q``): the next round starts from it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

import torch

from engine.averaging.allreduce import aggregate_parts, butterfly_allreduce
from engine.averaging.errors import AveragingError
from engine.averaging.powersgd import Layout, bases, decompress, project, residual, sketch, starting_q
from engine.averaging.round_plan import RoundPlan
from engine.averaging.tensor_parts import Averaged, ReducedParts
from engine.transport.mesh import PeerMesh
from engine.wire.commitments import Commitment

log = logging.getLogger(__name__)

AllReduce = Callable[[RoundPlan, torch.Tensor, int, float, PeerMesh, float], Awaitable[Averaged]]
Aggregate = Callable[[RoundPlan, int, PeerMesh, float], Awaitable[ReducedParts]]


async def powersgd_allreduce(plan: RoundPlan, local_sum: torch.Tensor, samples: int, loss_sum: float,
                             mesh: PeerMesh, timeout: float, *, layout: Layout,
                             feedback: torch.Tensor | None, seed: int,
                             warm: Sequence[torch.Tensor | None] | None = None,
                             allreduce: AllReduce = butterfly_allreduce) -> Averaged:
    """Average ``local_sum`` (gradient x samples, flat fp32) plus our error ``feedback``
    with the group's, compressed; raise AveragingError. ``local_sum`` is left as it is (a
    failed round gives it back). ``warm``: each matrix's Q the state holds (None: none)."""
    if local_sum.numel() != layout.numel:
        raise AveragingError(f"round {plan.round_id}: a gradient of {local_sum.numel()} values, "
                             f"the model has {layout.numel}")
    deadline = asyncio.get_running_loop().time() + timeout
    m = await asyncio.to_thread(_with_feedback, local_sum, feedback)
    q0 = starting_q(layout, warm or [None] * len(layout.matrices), seed, plan.epoch)
    sketched = await asyncio.to_thread(sketch, layout, m, q0)
    first = await allreduce(plan.phased(0), sketched, samples, loss_sum, mesh, _left(plan, deadline))
    basis = await asyncio.to_thread(bases, layout, first.vector)
    second: Averaged | None = None
    q_local: torch.Tensor | None = None
    if layout.compressed:
        q_local = await asyncio.to_thread(project, layout, m, basis)
        second = await allreduce(plan.phased(1), q_local, samples, loss_sum, mesh, _left(plan, deadline))
    q_avg = second.vector if second is not None else None
    step = await asyncio.to_thread(decompress, layout, first.vector, basis, q_avg)
    kept = await asyncio.to_thread(_residual, layout, m, basis, q_local, samples)
    return joined(first, second, step, kept, layout, overlaid=plan.groups is not None)


async def aggregate_phases(plan: RoundPlan, layout: Layout, mesh: PeerMesh, timeout: float,
                           aggregate: Aggregate = aggregate_parts) -> ReducedParts:
    """As an auxiliary member: reduce our parts of phase P, then of phase Q (it holds no
    model: ``layout`` comes from the task's shapes on the meta device)."""
    deadline = asyncio.get_running_loop().time() + timeout
    first = await aggregate(plan.phased(0), layout.p_numel, mesh, _left(plan, deadline))
    if not layout.compressed:
        first.phase_numel = [layout.p_numel, 0]
        return first
    second = await aggregate(plan.phased(1), layout.q_numel, mesh, _left(plan, deadline))
    return ReducedParts(first.results + second.results, seen_in_both(first.received, second.received),
                        joined_commitment(first.commitment, second.commitment, plan.groups is not None),
                        first.reduced + second.reduced, first.bytes_in + second.bytes_in,
                        [layout.p_numel, layout.q_numel])


def joined(first: Averaged, second: Averaged | None, step: torch.Tensor, feedback: torch.Tensor | None,
           layout: Layout, overlaid: bool = False) -> Averaged:
    """The round as one: the step, the samples and loss the last phase's reducers say
    (those of the values applied last), the senders seen in full in both phases, one
    commitment listing phase P's parts then phase Q's."""
    last = second if second is not None else first
    received = seen_in_both(first.received, second.received if second is not None else None)
    commitment = joined_commitment(first.commitment, second.commitment if second is not None else None,
                                   overlaid)
    reduced = first.reduced + (second.reduced if second is not None else [])
    next_q = ({mat.param: layout.q(second.vector, mat).clone() for mat in layout.matrices}
              if second is not None else {})
    return Averaged(step, last.samples, last.loss, received, commitment, reduced, first.first_sent,
                    residual=feedback, next_q=next_q, phase_numel=[layout.p_numel, layout.q_numel])


def seen_in_both(first: dict[str, int], second: dict[str, int] | None) -> dict[str, int]:
    """Per sender, the fewest samples its parts to us carried in the phases we reduced in
    (as TensorPartReducer.seen_in_all does across parts): a sender left out of one phase
    did not take part in full. An empty map is a phase we reduced nothing in."""
    if not second:
        return dict(first)
    if not first:
        return dict(second)
    return {s: min(first[s], second[s]) for s in sorted(first.keys() & second.keys())}


def joined_commitment(first: Commitment | None, second: Commitment | None,
                      overlaid: bool = False) -> Commitment | None:
    """One commitment for the round: each list by wire index, phase P's parts first.
    ``overlaid``: each phase's lists already span the round's indices (a grouped round's:
    planning/grouped_indices.py), each phase's parts at their own."""
    if first is None or second is None:
        return first or second
    if overlaid:
        def both(a: list[str | None], b: list[str | None]) -> list[str | None]:
            return [x or y for x, y in zip(a, b, strict=True)]

        return Commitment(sent=both(first.sent, second.sent), results=both(first.results, second.results),
                          reduced=first.reduced + second.reduced, shown=both(first.shown, second.shown))
    return Commitment(sent=first.sent + second.sent, results=first.results + second.results,
                      reduced=first.reduced + second.reduced, shown=first.shown + second.shown)


def _left(plan: RoundPlan, deadline: float) -> float:
    left = deadline - asyncio.get_running_loop().time()
    if left <= 0:
        raise AveragingError(f"round {plan.round_id} ran out of time between its phases")
    return left


def _with_feedback(local_sum: torch.Tensor, feedback: torch.Tensor | None) -> torch.Tensor:
    """(On a thread.) M = G + E, in a new vector: G must stay as it was taken."""
    m = local_sum.detach().to(torch.float32).reshape(-1).clone()
    if feedback is not None:
        if feedback.numel() != m.numel():
            raise AveragingError(f"error feedback of {feedback.numel()} values for a gradient of {m.numel()}")
        m.add_(feedback)
    return m


def _residual(layout: Layout, m: torch.Tensor, basis: list[torch.Tensor], q_local: torch.Tensor | None,
              samples: int) -> torch.Tensor | None:
    """(On a thread.) The error feedback to keep if the step is taken: what our own parts
    left out; all of M if we sent none (no samples: header-only parts); None (start
    again from zeros) if it is not finite -- our parts were then left out anyway."""
    if samples == 0:
        out = m
    elif q_local is None:
        out = residual(layout, m, basis, torch.empty(0))
    else:
        out = residual(layout, m, basis, q_local)
    if not bool(torch.isfinite(out).all()):
        log.warning("the error feedback is not finite: starting it again from zero")
        return None
    return out
