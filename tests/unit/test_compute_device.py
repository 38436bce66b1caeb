"""Micro-batches on another device than the master weights: a graphics card in production.
These machines have no CUDA, so the copy lives on the CPU here; the code path is the same,
and the steps must come out bit for bit the same as computing on the model itself."""

import pytest
import torch

from engine.averaging.tensor_parts import Averaged
from engine.governor.throttle import ComputeGate, MicroBatchAbandoned
from engine.project import OptimizerSpec, ScheduleSpec
from engine.tasks import create_task, initial_model
from engine.training import device as device_module
from engine.training.device import choose_device
from engine.training.lr_schedule import build_optimizer
from engine.training.optimizer import CollaborativeOptimizer
from engine.wire.control import RoundStart
from tests.collab.harness import TINY
from tests.lone_peer import lone_peer

ELSEWHERE = torch.device("cpu")  # stands for cuda:0: a separate copy of the model


async def alone(plan, vector, samples, loss_sum, timeout) -> Averaged:
    """A collaboration of one: the average is its own gradient sum over its samples."""
    return Averaged(vector / samples, samples, loss_sum / samples, {plan.me: samples})


@pytest.fixture(scope="module")
def task():
    return create_task("demo-lm", dict(TINY), None)


async def collaborative(task, device) -> CollaborativeOptimizer:
    model = initial_model(task, 7)
    gate = ComputeGate()
    gate.install(model)
    opt = CollaborativeOptimizer(model, build_optimizer(OptimizerSpec(), model.parameters()), ScheduleSpec(),
                                 project_id="p", gate=gate, compute_device=device)
    await opt.mark_synced()
    return opt


async def train(opt, task, epochs=3, switch_each_epoch=False) -> str:
    peer = lone_peer(opt, alone, target_batch_size=12)
    for epoch in range(epochs):
        for i in range(3):
            def micro_batch(index=3 * epoch + i):
                batch = task.batch(1, index).to(opt.compute_device)
                loss_sum = task.loss(opt.compute_model, batch) * batch.size
                loss_sum.backward()
                return batch.size, float(loss_sum.detach())

            await peer.compute(micro_batch, 3 * epoch + i)
            if switch_each_epoch and i == 0:  # the owner toggles "use the graphics card"
                await opt.set_compute_device(None if opt.compute_device is not None else ELSEWHERE)
        assert await peer.run_round(RoundStart(epoch + 1, epoch, ["me"], [1.0], 30.0)) is not None
    return opt.hash.value


async def test_micro_batches_on_a_copy_give_the_same_steps_bit_for_bit(task):
    plain, copied = await collaborative(task, None), await collaborative(task, ELSEWHERE)
    assert copied.compute_model is not copied.model
    assert await train(plain, task) == await train(copied, task)
    # The copy follows the master weights after every step.
    for ours, master in zip(copied.compute_model.state_dict().values(), copied.model.state_dict().values(),
                            strict=True):
        assert torch.equal(ours, master)


async def test_moving_mid_epoch_keeps_what_was_accumulated(task):
    plain, moving = await collaborative(task, None), await collaborative(task, ELSEWHERE)
    assert await train(plain, task) == await train(moving, task, switch_each_epoch=True)


async def test_pausing_stops_a_forward_pass_on_the_copy_too(task):
    opt = await collaborative(task, ELSEWHERE)
    opt.pause(True)
    batch = task.batch(1, 0)
    with pytest.raises(MicroBatchAbandoned):
        task.loss(opt.compute_model, batch)


@pytest.mark.parametrize("cuda, allowed, expected_device, words", [
    (False, True, None, "the CPU (no CUDA graphics card found)"),
    (True, False, None, "the CPU (use of the graphics card, Test GPU, is turned off)"),
    (True, True, torch.device("cuda", 0), "the graphics card (Test GPU)"),
])
def test_the_graphics_card_is_used_only_when_present_and_allowed(monkeypatch, cuda, allowed,
                                                                 expected_device, words):
    monkeypatch.setattr(device_module.torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(device_module.torch.cuda, "get_device_name", lambda index=0: "Test GPU")
    placement = choose_device(allowed)
    assert (placement.device, placement.description) == (expected_device, words)
