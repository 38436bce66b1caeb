"""A peer's training loop: micro-batch after micro-batch on the compute thread, the
heartbeat that tells the backbone it is alive when micro-batches are slow, and the warm-up
before either."""

from __future__ import annotations

import asyncio
import logging
import time

import torch

from engine.governor.throttle import MicroBatchAbandoned
from engine.peer.progress import ProgressReporter
from engine.project import Precision
from engine.tasks import RANDOM_STREAM, Task
from engine.training.optimizer import CollaborativeOptimizer
from engine.training.precision import LossScaler, autocast

log = logging.getLogger(__name__)

HEARTBEAT = 5.0  # well inside the backbone's peer timeout (15 s by default)


async def training_loop(task: Task, opt: CollaborativeOptimizer, progress: ProgressReporter,
                        precision: Precision, seed: int) -> None:
    scaler = LossScaler() if precision == "fp16" else None

    def micro_batch(index: int) -> tuple[int, float]:
        batch = task.batch(seed, index).to(opt.compute_device)
        with autocast(precision, opt.compute_device):
            loss_sum = task.loss(opt.compute_model, batch).float() * batch.size
        if scaler is None:
            loss_sum.backward()
        elif not scaler.backward(loss_sum, opt.accumulator.params):
            raise MicroBatchAbandoned  # it overflowed: no gradient was added
        return batch.size, float(loss_sum.detach())

    index = 0
    while True:
        await progress.until_room()
        used, added = await opt.compute_run(micro_batch, index, lambda: progress.due() or progress.full())
        index += used
        if added:
            await progress.report()


async def heartbeat_loop(progress: ProgressReporter) -> None:
    while True:
        await asyncio.sleep(HEARTBEAT / 2)
        await progress.keep_alive(HEARTBEAT)


def data_seed(chosen: int | None, peer_id: str) -> int:
    """This peer's own order of shards and examples (unless one was chosen)."""
    return chosen if chosen is not None else int(peer_id[:15], 16)


def warm_up(task: Task, model: torch.nn.Module, precision: Precision, seed: int) -> float:
    """One micro-batch, thrown away, before the peer says it is ready: the first one in a
    process allocates, builds its kernels and reads its first shard, several times the
    next ones' time, and the backbone times a peer's pace from its Ready -- a pace timed
    over it cut honest first claims. Nothing of it stays: gradients, buffers (batch norm's
    statistics) and the random stream are as they were, and the state is set by the sync.
    Returns the seconds its forward and backward passes took (more than the next ones')."""
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    batch = task.batch(seed, 0)  # (from its own generator; it may wait on a download)
    began = time.perf_counter()
    with RANDOM_STREAM, torch.random.fork_rng(devices=[]), autocast(precision, None):
        loss = task.loss(model, batch).float() * batch.size
    loss.backward()
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    seconds = time.perf_counter() - began
    log.info("warmed up on one micro-batch in %.2f s", seconds)
    return seconds
