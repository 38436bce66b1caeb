"""A peer's training loop: micro-batch after micro-batch on the compute thread, and the
heartbeat that tells the backbone it is alive when micro-batches are slow."""

from __future__ import annotations

import asyncio
import itertools
from typing import TYPE_CHECKING

from engine.governor.throttle import MicroBatchAbandoned
from engine.training.precision import LossScaler, autocast

if TYPE_CHECKING:
    from engine.peer.runner import Peer

HEARTBEAT = 5.0  # well inside the backbone's peer timeout (15 s by default)


async def training_loop(peer: Peer) -> None:
    opts, task, opt, precision = peer.options, peer.task, peer.optimizer, peer.project.precision
    seed = opts.data_seed if opts.data_seed is not None else int(peer.peer_id[:15], 16)
    scaler = LossScaler() if precision == "fp16" else None
    for index in itertools.count():
        def micro_batch(index: int = index) -> tuple[int, float]:
            batch = task.batch(seed, index).to(opt.compute_device)
            with autocast(precision, opt.compute_device):
                loss_sum = task.loss(opt.compute_model, batch).float() * batch.size
            if scaler is None:
                loss_sum.backward()
            elif not scaler.backward(loss_sum, opt.accumulator.params):
                raise MicroBatchAbandoned  # it overflowed: no gradient was added
            return batch.size, float(loss_sum.detach())

        await opt.compute(micro_batch, index)


async def heartbeat_loop(peer: Peer) -> None:
    while True:
        await asyncio.sleep(HEARTBEAT / 2)
        await peer.optimizer.keep_alive(HEARTBEAT)
