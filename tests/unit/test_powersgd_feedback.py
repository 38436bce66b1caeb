"""PowerSGD's error feedback on a peer (engine/training/optimizer.py): kept only once a step
is taken, put back with the state when that step is undone, untouched by a failed round or
a refused step, dropped with a downloaded or fresh state; and its warm Q, which the state
carries: hashed, served and checked with the rest. The averaging is the test's."""

import pytest
import torch

from engine.averaging.powersgd import Layout
from engine.averaging.tensor_parts import Averaged
from engine.project import OptimizerSpec, ScheduleSpec
from engine.tasks import create_task, initial_model
from engine.training.lr_schedule import build_optimizer
from engine.training.optimizer import CollaborativeOptimizer
from engine.training.params import trainable
from engine.training.state import WARM_SLOT, check_state, load_state, pack_state, warm_q, warm_slots
from engine.wire import ProtocolError
from engine.wire.control import RoundDone, RoundStart
from engine.wire.tensors import decode_file, encode_file
from tests.collab.harness import TINY
from tests.conftest import until
from tests.lone_peer import lone_peer
from tests.unit.test_overlap import micro_batch


@pytest.fixture(scope="module")
def task():
    return create_task("demo-lm", dict(TINY), None)


def make(task, outcomes, spec=None, rank=None):
    """A lone peer whose rounds return, in turn, ``outcomes``: (step or None, residual,
    and optionally the average Q it carries on)."""
    sent = []

    async def send(message) -> None:
        sent.append(message)

    async def average(plan, vector, samples, loss_sum, timeout) -> Averaged:
        step, residual, *carried = outcomes.pop(0)
        vector = vector / samples if step is None else step
        return Averaged(vector, samples, loss_sum / samples, {"me": samples}, residual=residual,
                        next_q=carried[0] if carried else {}, phase_numel=[3, 4])

    model = initial_model(task, 7)
    warm = Layout.of([tuple(p.shape) for p in trainable(model)], rank).warm_shapes() if rank else None
    opt = CollaborativeOptimizer(model, build_optimizer(spec or OptimizerSpec(), model.parameters()),
                                 ScheduleSpec(), project_id="p", warm_shapes=warm)
    return lone_peer(opt, average, send, target_batch_size=2), sent


async def step_once(peer, epoch, index):
    await peer.compute(lambda: micro_batch(peer.task, peer.optimizer)(index), index)
    return await peer.run_round(RoundStart(epoch + 1, epoch, ["me"], [1.0], 10.0))


async def test_the_residual_is_kept_with_its_step_and_put_back_when_the_step_is_undone(task):
    numel = sum(p.numel() for p in initial_model(task, 7).parameters() if p.requires_grad)
    first, second = torch.full((numel,), 1.0), torch.full((numel,), 2.0)
    peer, sent = make(task, [(None, first), (None, second)])
    peer.task = task
    opt = peer.optimizer
    start = await opt.reset(initial_model(task, 7))
    await opt.mark_synced()
    assert await step_once(peer, 0, 0) is not None
    assert opt.residual is first and opt.kept.residual is None
    (done,) = [m for m in sent if isinstance(m, RoundDone)]
    assert done.phase_numel == [3, 4]
    opt.settled(1, done.state_sha256)
    await until(lambda: opt.kept is None, 10)
    assert await step_once(peer, 1, 1) is not None
    assert opt.residual is second and opt.kept.residual is first
    assert await opt.restore(1, done.state_sha256)
    assert opt.residual is first  # the undone step's residual is gone with it
    assert start != done.state_sha256


async def test_a_refused_step_leaves_the_residual_as_it_was(task):
    numel = sum(p.numel() for p in initial_model(task, 7).parameters() if p.requires_grad)
    poisoned = torch.full((numel,), float("nan"))
    peer, _ = make(task, [(poisoned, torch.ones(numel))])
    peer.task = task
    opt = peer.optimizer
    await opt.reset(initial_model(task, 7))
    await opt.mark_synced()
    assert await step_once(peer, 0, 0) is None
    assert opt.residual is None and opt.accumulator.samples > 0


async def test_a_fresh_state_drops_the_residual(task):
    numel = sum(p.numel() for p in initial_model(task, 7).parameters() if p.requires_grad)
    peer, _ = make(task, [(None, torch.ones(numel))])
    peer.task = task
    opt = peer.optimizer
    await opt.reset(initial_model(task, 7))
    await opt.mark_synced()
    assert await step_once(peer, 0, 0) is not None and opt.residual is not None
    await opt.reset(initial_model(task, 7))
    assert opt.residual is None


def carried_q(opt, seed):
    g = torch.Generator().manual_seed(seed)
    return {i: torch.randn(*shape, generator=g) for i, shape in opt.warm_shapes.items()}


@pytest.mark.parametrize("name", ["adamw", "sgd"])
async def test_the_warm_q_is_state_hashed_served_checked_and_undone_with_its_step(task, name):
    numel = sum(p.numel() for p in initial_model(task, 7).parameters() if p.requires_grad)
    peer, sent = make(task, [], OptimizerSpec(name=name, lr=0.01), rank=2)
    opt = peer.optimizer
    first, second = carried_q(opt, 1), carried_q(opt, 2)
    peer.task = task
    assert opt.warm_shapes, "the tiny model has matrices rank 2 shrinks"
    await opt.reset(initial_model(task, 7))
    await opt.mark_synced()
    indices = sorted(opt.warm_shapes)
    assert warm_q(opt.optimizer, opt.params, indices) == [None] * len(indices)

    outcomes = [(None, torch.zeros(numel), first), (None, torch.zeros(numel), second)]
    peer.pipeline.average = make(task, outcomes)[0].pipeline.average
    assert await step_once(peer, 0, 0) is not None
    held = warm_q(opt.optimizer, opt.params, indices)
    assert all(torch.equal(q, first[i]) for q, i in zip(held, indices, strict=True))
    (done,) = [m for m in sent if isinstance(m, RoundDone)]
    opt.settled(1, done.state_sha256)
    await until(lambda: opt.kept is None, 10)

    # A joiner gets it with the state, under the state's hash; one built without it differs.
    index, payload = await opt.snapshot()
    state = decode_file(encode_file(index, payload))
    assert state.state_sha256() == done.state_sha256
    joiner = initial_model(task, 7)
    joiner_opt = build_optimizer(OptimizerSpec(name=name, lr=0.01), joiner.parameters())
    load_state(state, joiner, joiner_opt, "p", warm_slots(opt.optimizer, opt.params, opt.warm_shapes))
    held = [joiner_opt.state[p][WARM_SLOT] for p in (trainable(joiner)[i] for i in indices)]
    assert all(torch.equal(q, first[i]) for q, i in zip(held, indices, strict=True))
    with pytest.raises(ProtocolError, match="bad optimizer state entry"):
        check_state(state, joiner, joiner_opt, "p")  # a project that compresses nothing

    # A discarded step takes its Q with it.
    assert await step_once(peer, 1, 1) is not None
    assert torch.equal(warm_q(opt.optimizer, opt.params, indices)[0], second[indices[0]])
    assert await opt.restore(1, done.state_sha256)
    assert torch.equal(warm_q(opt.optimizer, opt.params, indices)[0], first[indices[0]])


async def test_a_state_whose_warm_q_does_not_fit_is_refused(task):
    model = initial_model(task, 7)
    params = trainable(model)
    warm = Layout.of([tuple(p.shape) for p in params], 2).warm_shapes()
    index = next(iter(warm))
    plain = next(i for i in range(len(params)) if i not in warm)

    def refused(slots: dict, why: str, name: str = "adamw") -> None:
        optimizer = build_optimizer(OptimizerSpec(name=name), model.parameters())
        for i, entry in slots.items():
            optimizer.state[params[i]].update(entry)
        state = decode_file(encode_file(*pack_state(model, optimizer, 3, "p")))
        with pytest.raises(ProtocolError, match=why):
            check_state(state, model, optimizer, "p", warm)

    refused({index: {WARM_SLOT: torch.zeros(warm[index][0] + 1, 2)}}, "wrong shape")
    refused({plain: {WARM_SLOT: torch.zeros(4, 2)}}, "bad optimizer state entry")
    # Adam, seeing an entry, would take its own slots as there and crash on the step.
    refused({index: {WARM_SLOT: torch.zeros(*warm[index])}}, "some of a parameter's slots but not all")
    # SGD reads its one slot by name: a warm Q alone is a state it can hold, if finite.
    refused({index: {WARM_SLOT: torch.full(warm[index], float("nan"))}}, "not finite", "sgd")
