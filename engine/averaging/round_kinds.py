"""Which all-reduce a round runs, from its plan alone: flat (averaging/allreduce.py), in
groups when it has more members than the project's group size (averaging/grouped.py), and
either of them twice, compressed, in a PowerSGD project (averaging/powersgd_round.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.averaging.allreduce import butterfly_allreduce
from engine.averaging.grouped import grouped_allreduce
from engine.averaging.powersgd import Layout
from engine.averaging.powersgd_round import powersgd_allreduce
from engine.averaging.round_plan import RoundPlan
from engine.averaging.tensor_parts import Averaged
from engine.transport.mesh import PeerMesh


@dataclass(frozen=True)
class PowerSGDInputs:
    """What a PowerSGD round needs of the peer's state beyond the gradient."""

    layout: Layout  # the model's gradient as matrices
    feedback: torch.Tensor | None  # the error the last step left out
    seed: int  # the project's: every member draws the same first Q
    warm: Sequence[torch.Tensor | None]  # each matrix's Q the state holds


async def average_round(plan: RoundPlan, vector: torch.Tensor, samples: int, loss_sum: float, mesh: PeerMesh,
                        timeout: float, powersgd: PowerSGDInputs | None = None) -> Averaged:
    """Average ``vector`` (gradient x samples, flat fp32) with the round's members; raise
    AveragingError. ``powersgd``: needed when the plan has two phases."""
    allreduce = butterfly_allreduce if plan.groups is None else grouped_allreduce
    if plan.phases == 1:
        return await allreduce(plan, vector, samples, loss_sum, mesh, timeout)
    assert powersgd is not None, "a PowerSGD round needs the peer's PowerSGD state"
    return await powersgd_allreduce(plan, vector, samples, loss_sum, mesh, timeout, layout=powersgd.layout,
                                    feedback=powersgd.feedback, seed=powersgd.seed, warm=powersgd.warm,
                                    allreduce=allreduce)
