"""Overlapped rounds on the real optimizer, without a network: micro-batches go on while a
round averages and steps, on the state before that step, and the next round takes them."""

import asyncio

import msgspec
import pytest
import torch

from engine.averaging.tensor_parts import Averaged
from engine.project import OptimizerSpec, ProjectSpec, ScheduleSpec
from engine.tasks import create_task, initial_model
from engine.training.lr_schedule import build_optimizer
from engine.training.optimizer import CollaborativeOptimizer
from engine.wire.codec import encode
from engine.wire.control import RoundStart
from tests.collab.harness import TINY, tiny_project
from tests.lone_peer import lone_peer


@pytest.fixture(scope="module")
def task():
    return create_task("demo-lm", dict(TINY), None)


def micro_batch(task, opt: CollaborativeOptimizer):
    def run(index: int) -> tuple[int, float]:
        batch = task.batch(1, index)
        loss_sum = task.loss(opt.compute_model, batch) * batch.size
        loss_sum.backward()
        return batch.size, float(loss_sum.detach())
    return run


def weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


async def test_micro_batches_go_on_during_a_round_on_the_state_before_its_step(task):
    model = initial_model(task, 7)
    opt = CollaborativeOptimizer(model, build_optimizer(OptimizerSpec(), model.parameters()), ScheduleSpec(),
                                 project_id="p", overlap=True)
    averaging, release = asyncio.Event(), asyncio.Event()

    async def slow_average(plan, vector, samples, loss_sum, timeout) -> Averaged:
        averaging.set()
        await release.wait()  # the round's network time
        return Averaged(vector / samples, samples, loss_sum / samples, {plan.me: samples})

    peer = lone_peer(opt, slow_average, me="me", target_batch_size=8)
    await opt.mark_synced()
    before = weights(opt.compute_model)
    await opt.compute_run(micro_batch(task, opt), 0, lambda: len(opt.accumulator.batches) >= 2)
    start = RoundStart(1, 0, ["me"], [1.0], 30.0)
    round_ = asyncio.ensure_future(peer.run_round(start))
    await asyncio.wait_for(averaging.wait(), 30)

    used, added = await asyncio.wait_for(
        opt.compute_run(micro_batch(task, opt), 2, lambda: len(opt.accumulator.batches) >= 3), 30)
    assert (used, added) == (3, 3), "computing went on while the round averaged"
    release.set()
    outcome = await asyncio.wait_for(round_, 30)
    assert outcome is not None
    step, taken = outcome.step, outcome.taken
    assert step.epoch == opt.epoch == 1 and taken.batches == [0, 1] and taken.computed_on == 0
    assert opt.accumulator.batches == [2, 3, 4] and opt.accumulator.computed_on == 0, \
        "what was computed during the round waits for the next one"
    for copy, old in zip(opt.compute_model.parameters(), before, strict=True):
        assert torch.equal(copy.detach(), old), "micro-batches still run on the state before the step"
    assert any(not torch.equal(old, new.detach()) for old, new in zip(before, opt.model.parameters(),
                                                                      strict=True))

    release.clear()
    averaging.clear()
    second = asyncio.ensure_future(peer.run_round(RoundStart(2, 1, ["me"], [1.0], 30.0)))
    await asyncio.wait_for(averaging.wait(), 30)
    for copy, master in zip(opt.compute_model.parameters(), opt.model.parameters(), strict=True):
        assert torch.equal(copy.detach(), master.detach()), "taking the gradient moves the copy to the step"
    release.set()
    taken = (await asyncio.wait_for(second, 30)).taken
    assert taken.batches == [2, 3, 4] and taken.computed_on == 0 and opt.epoch == 2


def test_overlap_is_refused_in_local_mode():
    spec = tiny_project(overlap=True)
    assert msgspec.json.decode(encode(spec), type=ProjectSpec).overlap
    local = msgspec.structs.asdict(spec) | {"mode": "local"}
    with pytest.raises(msgspec.ValidationError, match="overlap applies to sync rounds"):
        msgspec.json.decode(msgspec.json.encode(local), type=ProjectSpec)
