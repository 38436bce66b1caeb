"""Local mode (DiLoCo) on the real optimizer, without a network: inner steps on a local
copy, pseudo-gradients weighted by samples, one outer step every member takes alike."""

import asyncio
from functools import partial

import pytest
import torch

from engine.averaging.errors import AveragingError
from engine.averaging.tensor_parts import Averaged
from engine.project import LocalSpec, OptimizerSpec, ScheduleSpec
from engine.tasks import create_task, initial_model
from engine.training.local import LocalSteps
from engine.training.lr_schedule import build_optimizer, outer_optimizer
from engine.training.optimizer import CollaborativeOptimizer
from engine.training.params import flat_params, trainable
from engine.training.state import state_sha256
from engine.wire.control import RoundDone, RoundStart
from tests.collab.harness import TINY
from tests.lone_peer import LonePeer, lone_peer

SCHEDULE = ScheduleSpec(type="linear", warmup_epochs=1, total_epochs=20)
# Adam's eps at 1e-6: the gradient of attention's key bias is rounding noise (softmax ignores
# that bias), and at eps 1e-8 Adam turns noise into full steps, so the last bit of a
# difference (global - (global - local) is not always local in fp32) grew to 3e-5 there.
INNER = OptimizerSpec(name="adamw", lr=1e-2, eps=1e-6, clip_grad_norm=1.0)


@pytest.fixture(scope="module")
def task():
    return create_task("demo-lm", dict(TINY), None)


async def discard(message) -> None:
    pass


async def alone(plan, vector, samples, loss_sum, timeout) -> Averaged:
    return Averaged(vector / samples, samples, loss_sum / samples, {plan.me: samples})


def make(task, mode: str, averager=alone, me: str = "me", target: int = 8,
         local: LocalSpec | None = None, send=discard) -> LonePeer:
    model = initial_model(task, 7)
    steps = None
    if mode == "local":
        spec = local or LocalSpec(inner_batch_size=target, outer_lr=1.0, outer_momentum=0.0)
        optimizer = outer_optimizer(spec, trainable(model))
        steps = LocalSteps(spec, partial(build_optimizer, INNER), INNER.clip_grad_norm)
    else:
        optimizer = build_optimizer(INNER, model.parameters())
    opt = CollaborativeOptimizer(model, optimizer, SCHEDULE, project_id="p",
                                 clip_grad_norm=INNER.clip_grad_norm, local=steps)
    return lone_peer(opt, averager, send, me=me, target_batch_size=target)


async def feed(task, peer: LonePeer, batches: list[int], size: int = 4) -> None:
    opt = peer.optimizer
    for index in batches:
        def micro_batch(index=index):
            batch = task.batch(size, index)
            loss_sum = task.loss(opt.compute_model, batch) * batch.size
            loss_sum.backward()
            return batch.size, float(loss_sum.detach())

        await peer.compute(micro_batch, index)


def start(epoch: int, group=("me",), shares=None) -> RoundStart:
    group = list(group)
    return RoundStart(epoch + 1, epoch, group, shares or [1.0 / len(group)] * len(group), 30.0)


async def test_one_inner_step_per_outer_step_with_a_plain_outer_step_is_the_sync_step(task):
    """Outer lr 1 without momentum, and an inner batch the size of the target: each outer
    step lands on the local copy's parameters, which took the very step sync would."""
    peers = make(task, "sync"), make(task, "local")
    sync, local = (p.optimizer for p in peers)
    for opt in (sync, local):
        await opt.mark_synced()
    for epoch in range(5):
        for peer in peers:
            await feed(task, peer, [2 * epoch, 2 * epoch + 1])
            assert await peer.run_round(start(epoch)) is not None
    assert sync.epoch == local.epoch == 5 and local.local.steps == 0
    ours, theirs = flat_params(trainable(local.model)), flat_params(trainable(sync.model))
    assert not torch.equal(ours, flat_params(trainable(initial_model(task, 7))))
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


async def test_members_average_pseudo_gradients_by_samples_and_take_one_outer_step(task):
    """Two members, 8 and 16 samples, inner steps every 4: both end on the same state, and
    that state is the Nesterov step on the samples-weighted pseudo-gradient."""
    spec = LocalSpec(inner_batch_size=4, outer_lr=0.7, outer_momentum=0.9)
    brought: dict[str, tuple[torch.Tensor, int]] = {}
    both = asyncio.Event()

    async def together(plan, vector, samples, loss_sum, timeout) -> Averaged:
        brought[plan.me] = (vector.clone(), samples)
        if len(brought) == 2:
            both.set()
        await asyncio.wait_for(both.wait(), 10)
        total = sum(s for _, s in brought.values())
        mean = sum(v for v, _ in brought.values()) / total
        return Averaged(mean, total, None, {p: s for p, (_, s) in brought.items()})

    peers = (make(task, "local", together, "a", target=24, local=spec),
             make(task, "local", together, "b", target=24, local=spec))
    a, b = (p.optimizer for p in peers)
    global_before = flat_params(trainable(a.model))
    for opt in (a, b):
        await opt.mark_synced()
    await feed(task, peers[0], [0, 1])
    await feed(task, peers[1], [10, 11, 12, 13])
    assert (a.local.steps, b.local.steps) == (2, 4), "one inner step per 4 samples"
    local_a, local_b = flat_params(a.local.params), flat_params(b.local.params)
    steps = await asyncio.gather(*(p.run_round(start(0, ["a", "b"])) for p in peers))
    assert all(s is not None for s in steps)
    assert a.hash.value == b.hash.value == state_sha256(a.model, a.optimizer, 1)
    pseudo = ((global_before - local_a) * 8 + (global_before - local_b) * 16) / 24
    expected = global_before - 0.7 * (pseudo + 0.9 * pseudo)  # Nesterov's first step
    torch.testing.assert_close(flat_params(trainable(a.model)), expected, rtol=1e-5, atol=1e-6)
    # The local copies start again from the new global model; the inner state stays local.
    assert torch.equal(flat_params(a.local.params), flat_params(trainable(a.model)))
    assert a.local.inner.state and a.local.steps == 0


async def test_a_failed_round_loses_no_local_progress(task):
    sent = []

    async def send(message) -> None:
        sent.append(message)

    async def failing(plan, vector, samples, loss_sum, timeout) -> Averaged:
        raise AveragingError("a peer vanished", set())

    peer = make(task, "local", failing, send=send, local=LocalSpec(inner_batch_size=4))
    opt = peer.optimizer
    await opt.mark_synced()
    await feed(task, peer, [0, 1, 2])
    progress = flat_params(opt.local.params)
    assert await peer.run_round(start(0)) is None
    (done,) = [m for m in sent if isinstance(m, RoundDone)]
    assert not done.ok and opt.epoch == 0
    assert opt.accumulator.samples == 12, "its samples count for the next round"
    assert torch.equal(flat_params(opt.local.params), progress)


async def test_an_undone_outer_step_puts_the_local_copy_back(task):
    """The collaboration settled on another step: the peer goes back to the kept global
    state, and its copy to where it was before that round, its samples counted again."""
    peer = make(task, "local", local=LocalSpec(inner_batch_size=4))
    opt = peer.optimizer
    before = await opt.reset(initial_model(task, 7))
    await opt.mark_synced()
    await feed(task, peer, [0, 1])
    progress = flat_params(opt.local.params)
    assert await peer.run_round(start(0)) is not None and opt.epoch == 1
    assert await opt.restore(0, before)
    assert opt.epoch == 0 and opt.hash.value == before == state_sha256(opt.model, opt.optimizer, 0)
    torch.testing.assert_close(flat_params(opt.local.params), progress, rtol=1e-5, atol=1e-6)
    assert opt.accumulator.samples == 8
