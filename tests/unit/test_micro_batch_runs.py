"""Micro-batches run in runs on the compute thread, one hop from the event loop per run:
a run ends when a report is due or anything else waits for the thread, so neither a round
nor a report waits for more than the micro-batch under way. Their forward passes carry few
hooks: a pause still stops one partway."""

import asyncio
import threading

import pytest
import torch

from engine.governor.throttle import CHECKS, SLICE, ComputeGate, MicroBatchAbandoned
from engine.project import OptimizerSpec, ScheduleSpec
from engine.tasks import create_task, initial_model
from engine.training import optimizer as optimizer_module
from engine.training.kept_state import is_finite
from engine.training.lr_schedule import build_optimizer
from engine.training.optimizer import CollaborativeOptimizer
from tests.collab.harness import TINY


@pytest.fixture(scope="module")
def task():
    return create_task("demo-lm", dict(TINY), None)


async def synced_optimizer(task) -> CollaborativeOptimizer:
    model = initial_model(task, 7)
    opt = CollaborativeOptimizer(model, build_optimizer(OptimizerSpec(), model.parameters()), ScheduleSpec(),
                                 project_id="p")
    await opt.mark_synced()
    return opt


def counted(task, opt: CollaborativeOptimizer, ran: list[int],
            after: dict[int, threading.Event] | None = None,
            before: dict[int, threading.Event] | None = None):
    """A real micro-batch that records its id (and signals ``after[id]`` once done; waits
    for ``before[id]`` to start)."""
    def micro_batch(index: int) -> tuple[int, float]:
        if before and index in before:
            assert before[index].wait(30), "the test let this micro-batch start"
        batch = task.batch(1, index)
        loss_sum = task.loss(opt.compute_model, batch) * batch.size
        loss_sum.backward()
        ran.append(index)
        if after and index in after:
            after[index].set()
        return batch.size, float(loss_sum.detach())
    return micro_batch


async def test_a_run_ends_when_a_report_is_due(task):
    opt = await synced_optimizer(task)
    ran: list[int] = []
    used, added = await opt.compute_run(counted(task, opt, ran), 10, lambda: len(ran) >= 3)
    assert (used, added) == (3, 3)
    assert ran == [10, 11, 12], "ids follow on from the first"
    assert opt.accumulator.batches == [10, 11, 12] and opt.accumulator.samples == 3 * TINY["micro_batch"]


async def long_run_under_way(task, monkeypatch):
    """A run that would go on for ten minutes without yielding, two micro-batches in. Its
    third micro-batch starts only once other work is queued for the thread, so however
    slow the machine, the run has that one under way (or none) when the work arrives."""
    monkeypatch.setattr(optimizer_module, "RUN_SECONDS", 600.0)
    opt = await synced_optimizer(task)
    ran: list[int] = []
    second_done, third_may_start = {1: threading.Event()}, {2: threading.Event()}
    queue = opt.thread.run

    def queued(fn, **options):
        job = queue(fn, **options)
        third_may_start[2].set()
        return job
    run = asyncio.ensure_future(opt.compute_run(counted(task, opt, ran, second_done, third_may_start), 0,
                                                lambda: False))
    assert await asyncio.to_thread(second_done[1].wait, 30), "the run is under way"
    monkeypatch.setattr(opt.thread, "run", queued)
    return opt, run, ran


async def test_a_round_opened_during_a_long_run_waits_for_one_micro_batch_only(task, monkeypatch):
    opt, run, ran = await long_run_under_way(task, monkeypatch)
    taken = await asyncio.wait_for(opt.begin_round(0, budget=30.0), 30)
    used, added = await asyncio.wait_for(run, 30)
    assert taken is not None
    assert taken.batches == ran == list(range(used)), "all the run added, and nothing after it, was taken"
    assert 2 <= used <= 3, "the run stopped after the micro-batch under way when the round opened"
    assert added == used


async def test_a_snapshot_for_a_joiner_waits_for_one_micro_batch_only(task, monkeypatch):
    """A snapshot stops no computing: the run yields to it because it waits for the thread."""
    opt, run, _ = await long_run_under_way(task, monkeypatch)
    index, _ = await asyncio.wait_for(opt.snapshot(), 30)
    used, _ = await asyncio.wait_for(run, 30)
    assert index.meta.epoch == 0 and 2 <= used <= 3


async def test_a_paused_peer_starts_no_run(task):
    opt = await synced_optimizer(task)
    opt.pause(True)
    ran: list[int] = []
    run = asyncio.ensure_future(opt.compute_run(counted(task, opt, ran), 0, lambda: True))
    done, _ = await asyncio.wait({run}, timeout=0.5)
    assert not done and ran == []
    opt.pause(False)
    assert await asyncio.wait_for(run, 30) == (1, 1)


def test_finiteness_is_exact_even_where_a_quick_sum_overflows():
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    with torch.no_grad():
        model.weight.fill_(3e38)  # finite, but their sum is not
    assert is_finite(model, opt)
    for bad in (float("inf"), float("-inf"), float("nan")):
        with torch.no_grad():
            model.bias[2] = bad
        assert not is_finite(model, opt)


def test_a_model_whose_micro_batch_is_short_is_checked_once_per_forward_pass():
    """A micro-batch of a few milliseconds is hooked only at its start (digits: 16 hooks cost
    2% of it); a longer one gets one more hook per SLICE, up to CHECKS. Either way a pause
    stops the next forward pass before any layer runs."""
    layers = [torch.nn.Linear(4, 4) for _ in range(160)]
    model = torch.nn.Sequential(*layers)
    gate = ComputeGate()
    gate.install(model, micro_batch_seconds=0.006)
    assert [m for m in model.modules() if m._forward_pre_hooks] == [model]
    ran: list[int] = []
    for i, layer in enumerate(layers):
        layer.register_forward_hook(lambda module, inputs, output, i=i: ran.append(i))
    gate.abandon(True)
    with pytest.raises(MicroBatchAbandoned):
        model(torch.ones(1, 4))
    assert ran == []
    longer = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(160)])
    ComputeGate().install(longer, micro_batch_seconds=2.5 * SLICE)
    assert sum(len(m._forward_pre_hooks) for m in longer.modules()) == 3


def test_a_pause_stops_a_forward_pass_partway_with_a_few_hooks_only():
    """The gate hooks a sixteenth of a deep model's modules, not each of them, and a pause
    still stops its forward pass partway."""
    layers = [torch.nn.Linear(4, 4) for _ in range(160)]
    model = torch.nn.Sequential(*layers)
    gate = ComputeGate()
    gate.install(model)
    hooked = sum(len(m._forward_pre_hooks) for m in model.modules())
    assert 1 <= hooked <= CHECKS + 1
    ran: list[int] = []
    for i, layer in enumerate(layers):
        layer.register_forward_hook(lambda module, inputs, output, i=i: ran.append(i))
    owner_back = layers[80].register_forward_hook(lambda module, inputs, output: gate.abandon(True))
    with pytest.raises(MicroBatchAbandoned):
        model(torch.ones(1, 4))
    assert 80 <= max(ran) <= 80 + 160 // CHECKS + 1, "it stopped at the next hooked module"
    owner_back.remove()
    gate.abandon(False)
    ran.clear()
    model(torch.ones(1, 4))
    assert len(ran) == 160
