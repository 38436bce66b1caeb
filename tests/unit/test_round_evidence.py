"""A peer's reports are the evidence its claim is judged by: a real optimizer reporting to a
real tracker, with the tracker's clock in the test's hands."""

import time

import pytest

from engine.averaging.tensor_parts import Averaged
from engine.backbone.tracker import RecordCredits, RecordStep, Send, Tracker
from engine.peer import progress as progress_module
from engine.project import OptimizerSpec, ScheduleSpec
from engine.tasks import create_task, initial_model
from engine.training.lr_schedule import build_optimizer
from engine.training.optimizer import CollaborativeOptimizer
from engine.wire.control import Progress, Ready, RoundDone, RoundStart, SyncRequest
from tests.collab.harness import TINY
from tests.lone_peer import lone_peer
from tests.unit.tracker_helpers import Clock, project


def two_ready_peers(clock: Clock, target_batch_size: int) -> Tracker:
    """A tracker with "me" and "other" joined and ready at epoch 0."""
    tracker = Tracker(project(target_batch_size=target_batch_size), clock=clock)
    for peer in ("me", "other"):
        tracker.join(peer, peer)
        tracker.handle(peer, SyncRequest())
        tracker.handle(peer, Ready(0, "h0"))
    return tracker


@pytest.fixture(scope="module")
def task():
    return create_task("demo-lm", dict(TINY), None)


async def test_a_peer_whose_only_report_followed_a_slow_micro_batch_is_credited_all_it_brought(
        task, monkeypatch):
    """Under load the first micro-batch of an epoch can be several times slower than the
    rest. If that was the peer's only report before the round, its pace looks low; the
    report it sends on taking its accumulator must keep its honest claim whole."""
    monkeypatch.setattr(progress_module, "MIN_REPORT_GAP", 60.0)  # no report but the first
    clock = Clock()
    tracker = two_ready_peers(clock, 100)
    outs = []

    async def send(message) -> None:
        outs.extend(tracker.handle("me", message))

    async def with_other(plan, vector, samples, loss_sum, timeout) -> Averaged:
        return Averaged(vector / samples, samples + 100, loss_sum / samples, {"me": samples, "other": 100})

    model = initial_model(task, 7)
    opt = CollaborativeOptimizer(model, build_optimizer(OptimizerSpec(), model.parameters()), ScheduleSpec(),
                                 project_id="p")
    peer = lone_peer(opt, with_other, send, target_batch_size=100)
    await opt.mark_synced()

    def micro_batch(index, slow=False):
        def run():
            if slow:
                time.sleep(0.2)  # stands for a micro-batch that waited on a busy CPU
            batch = task.batch(1, index)
            loss_sum = task.loss(opt.compute_model, batch) * batch.size
            loss_sum.backward()
            return batch.size, float(loss_sum.detach())
        return run

    clock.now += 0.25
    await peer.compute(micro_batch(0, slow=True), 0)
    first_report = tracker.peers["me"].samples
    assert first_report > 0, "the first micro-batch of the epoch is reported"
    for i in range(1, 21):  # fast ones, unreported: the next report is a minute away
        await peer.compute(micro_batch(i), i)
    brought = opt.accumulator.samples
    assert tracker.peers["me"].samples == first_report < brought / 10
    clock.now += 0.2
    (start,) = [o.msg for o in tracker.handle("other", Progress(0, 100, 400.0, 2.0, 0.25))
                if isinstance(o, Send) and o.to == "me" and isinstance(o.msg, RoundStart)]
    clock.now += 0.05
    assert await peer.run_round(start) is not None
    mine = peer.pipeline.last_step
    assert mine is not None and mine.state_sha256
    # The other member, a reducer too, saw the same parts and reached the same state.
    outs.extend(tracker.handle("other", RoundDone(start.round_id, 0, ok=True, state_sha256=mine.state_sha256,
                                                  samples=brought + 100, received=dict(mine.received),
                                                  proof=mine.proof)))
    (step,) = [o.step for o in outs if isinstance(o, RecordStep)]
    (record,) = [o for o in outs if isinstance(o, RecordCredits)]
    assert record.credits["me"].samples == brought
    assert sum(c.samples for c in record.credits.values()) == step.samples == brought + 100



async def test_a_peer_reports_every_micro_batch_until_its_first_step(task, monkeypatch):
    """Its first micro-batch is slow (allocations, the first shard read), so the pace the
    backbone measures of it is low until it has stepped; a round's cap of it must rest on a
    fresh count, not on that pace over a stale one."""
    monkeypatch.setattr(progress_module, "MIN_REPORT_GAP", 0.0)
    clock = Clock()
    tracker = two_ready_peers(clock, 40)
    progress: list[Progress] = []

    async def send(message) -> None:
        if isinstance(message, Progress):
            progress.append(message)
        tracker.handle("me", message)

    async def alone(plan, vector, samples, loss_sum, timeout) -> Averaged:
        return Averaged(vector / samples, samples, loss_sum / samples, {"me": samples})

    model = initial_model(task, 7)
    opt = CollaborativeOptimizer(model, build_optimizer(OptimizerSpec(), model.parameters()), ScheduleSpec(),
                                 project_id="p")
    peer = lone_peer(opt, alone, send, target_batch_size=1000)
    await opt.mark_synced()

    def micro_batch(index):
        def run():
            batch = task.batch(1, index)
            loss_sum = task.loss(opt.compute_model, batch) * batch.size
            loss_sum.backward()
            return batch.size, float(loss_sum.detach())
        return run

    for i in range(5):
        clock.now += 0.1
        await peer.compute(micro_batch(i), i)
    assert [p.samples for p in progress] == [opt.accumulator.samples * (i + 1) // 5 for i in range(5)]
    assert tracker.peers["me"].samples == opt.accumulator.samples
    (start,) = [o.msg for o in tracker.handle("other", Progress(0, 40, 400.0, 2.0, 0.25))
                if isinstance(o, Send) and o.to == "me" and isinstance(o.msg, RoundStart)]
    assert await peer.run_round(start) is not None
    progress.clear()
    for i in range(5, 10):
        await peer.compute(micro_batch(i), i)
    assert len(progress) == 1, "after its first step, the first micro-batch of an epoch and the interval"
