"""Whatever a round delivers, a peer never takes a step that leaves its state non-finite:
it refuses the step, says so, keeps its state and what it had accumulated."""

import pytest
import torch

from engine.averaging.tensor_parts import Averaged
from engine.project import OptimizerSpec, ScheduleSpec
from engine.tasks import create_task, initial_model
from engine.training.lr_schedule import build_optimizer
from engine.training.optimizer import CollaborativeOptimizer
from engine.training.state import state_sha256
from engine.wire.control import RoundDone, RoundStart
from tests.collab.harness import TINY
from tests.lone_peer import lone_peer


@pytest.fixture(scope="module")
def task():
    return create_task("demo-lm", dict(TINY), None)


def poisoned_nan(vector: torch.Tensor) -> torch.Tensor:
    out = vector.clone()
    out[3] = float("nan")
    return out


def poisoned_huge(vector: torch.Tensor) -> torch.Tensor:
    """Finite, but its norm overflows: the step would turn the parameters into NaN."""
    return torch.full_like(vector, 3e38)


@pytest.mark.parametrize("poison", [poisoned_nan, poisoned_huge])
async def test_a_poisoned_average_is_refused_and_the_state_kept(task, poison):
    sent = []

    async def send(message) -> None:
        sent.append(message)

    async def poisoned(plan, vector, samples, loss_sum, timeout) -> Averaged:
        return Averaged(poison(vector / samples), samples, loss_sum / samples, {"me": samples})

    model = initial_model(task, 7)
    spec = OptimizerSpec(clip_grad_norm=None) if poison is poisoned_huge else OptimizerSpec()
    opt = CollaborativeOptimizer(model, build_optimizer(spec, model.parameters()), ScheduleSpec(),
                                 project_id="p")
    peer = lone_peer(opt, poisoned, send, target_batch_size=8)
    await opt.mark_synced()
    before = state_sha256(opt.model, opt.optimizer, 0)

    def micro_batch():
        batch = task.batch(4, 0)
        loss_sum = task.loss(opt.compute_model, batch) * batch.size
        loss_sum.backward()
        return batch.size, float(loss_sum.detach())

    await peer.compute(micro_batch, 0)
    brought = opt.accumulator.samples
    assert await peer.run_round(RoundStart(1, 0, ["me"], [1.0], 10.0)) is None
    (done,) = [m for m in sent if isinstance(m, RoundDone)]
    assert not done.ok and "not finite" in (done.error or "")
    assert opt.epoch == 0 and state_sha256(opt.model, opt.optimizer, 0) == before
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert opt.accumulator.samples == brought, "what it computed waits for the next round"
