"""Scoring the held-out set beside training: it gives way to a snapshot (a checkpoint, a
joiner) and to a round at the next batch, scores again a batch they cut short, and never
stops the peer. Before: a checkpoint snapshot that waited 5 s behind the scoring cut it
short, the MicroBatchAbandoned ended the peer ("internal error: " and nothing after), every
10 steps with the presets' settings (issue 49)."""

import asyncio
import logging
import threading
from dataclasses import dataclass

import pytest

from engine.governor.throttle import MicroBatchAbandoned
from engine.peer.background import PeerTasks
from engine.peer.evaluation import score_heldout
from engine.project import OptimizerSpec, ScheduleSpec
from engine.tasks import create_task, initial_model
from engine.training.lr_schedule import build_optimizer
from engine.training.optimizer import CollaborativeOptimizer
from engine.wire.control import Evaluated, Step
from tests.collab.harness import TINY

BATCHES = 6


@pytest.fixture
def task():
    task = create_task("demo-lm", dict(TINY), None)
    task.heldout = lambda: (task.batch(1, 1000 + i) for i in range(BATCHES))
    return task


async def synced_optimizer(task) -> CollaborativeOptimizer:
    model = initial_model(task, 7)
    opt = CollaborativeOptimizer(model, build_optimizer(OptimizerSpec(), model.parameters()), ScheduleSpec(),
                                 project_id="p")
    opt.thread.gate.install(opt.compute_model)
    await opt.mark_synced()
    return opt


def watched(task, scored: list[int], hold: int, reached: threading.Event, release: threading.Event):
    """The task's own metrics, recording each batch scored; the batch ``hold`` waits, on its
    first try, until the test releases it."""
    metrics = task.metrics

    def metrics_watched(model, batch):
        if batch.index == 1000 + hold and not reached.is_set():
            reached.set()
            assert release.wait(30), "the test released the batch"
        result = metrics(model, batch)
        scored.append(batch.index - 1000)
        return result
    return metrics_watched


async def reference(task, opt) -> float:
    """The held-out loss of the same state, scored with nothing else on the thread."""
    def whole(model) -> float:
        return sum(task.metrics(model, batch)["loss"] for batch in task.heldout())
    return await opt.evaluate(whole, opt.epoch)


@dataclass
class HeldScoring:
    """A scoring under way, held inside one of its batches until the test releases it."""

    opt: CollaborativeOptimizer
    expected: float  # the held-out loss summed, scored with nothing else on the thread
    scored: list[int]
    release: threading.Event
    sent: list[Evaluated]
    job: asyncio.Task


async def scoring_held_at(task, batch: int) -> HeldScoring:
    opt = await synced_optimizer(task)
    expected = await reference(task, opt)
    scored: list[int] = []
    reached, release = threading.Event(), threading.Event()
    task.metrics = watched(task, scored, batch, reached, release)
    sent: list[Evaluated] = []

    async def send(message):
        sent.append(message)
    step = Step(epoch=opt.epoch, round_id=1, loss=1.0, samples=1, peers=1, round_seconds=1.0,
                state_sha256="s" * 64)
    job = asyncio.ensure_future(score_heldout(task, opt, send, step))
    assert await asyncio.to_thread(reached.wait, 30), f"the scoring reached batch {batch}"
    return HeldScoring(opt, expected, scored, release, sent, job)


async def test_a_snapshot_waits_for_one_held_out_batch_not_the_whole_set(task):
    held = await scoring_held_at(task, 2)
    snapshot = asyncio.ensure_future(held.opt.snapshot())
    held.release.set()
    index, _ = await asyncio.wait_for(snapshot, 30)
    scored_before_the_snapshot = list(held.scored)
    await asyncio.wait_for(held.job, 30)
    assert index.meta.epoch == held.opt.epoch
    assert scored_before_the_snapshot == [0, 1, 2], "the snapshot came right after the batch under way"
    assert held.scored == list(range(BATCHES))
    (evaluated,) = held.sent
    assert evaluated.samples == BATCHES * TINY["micro_batch"]
    assert evaluated.loss == pytest.approx(held.expected / evaluated.samples, rel=1e-5)


async def test_a_batch_cut_short_for_a_round_is_scored_again(task):
    held = await scoring_held_at(task, 3)
    held.opt.thread.gate.cut_short()  # what a round or a snapshot does when it cannot wait
    held.release.set()
    await asyncio.wait_for(held.job, 30)
    assert held.scored == list(range(BATCHES)), "the cut batch was scored again, once"
    (evaluated,) = held.sent
    assert evaluated.loss == pytest.approx(held.expected / evaluated.samples, rel=1e-5)


async def test_a_chore_that_fails_leaves_the_peer_running_and_says_why(caplog):
    failures: list[BaseException] = []
    tasks = PeerTasks(failures.append)

    async def broken():
        raise MicroBatchAbandoned

    with caplog.at_level(logging.WARNING):
        await asyncio.gather(tasks.chore(broken(), "scoring the held-out set at epoch 10"),
                             return_exceptions=True)
        await asyncio.sleep(0)  # (done callbacks run on the loop's next turn)
    assert failures == []
    assert "scoring the held-out set at epoch 10 failed, training goes on: MicroBatchAbandoned" in caplog.text
    await asyncio.gather(tasks.spawn(broken()), return_exceptions=True)
    await asyncio.sleep(0)
    assert [type(f) for f in failures] == [MicroBatchAbandoned], "a task of the peer's own still stops it"
