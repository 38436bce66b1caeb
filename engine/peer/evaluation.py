"""Scoring the project's held-out set on a settled state, for the learning curve: the
members a step chose (engine/evaluators.py) score the state they hold and tell the backbone."""

from __future__ import annotations

import itertools
import logging

import torch

from engine.peer.progress import SendControl
from engine.tasks import Task
from engine.training.optimizer import CollaborativeOptimizer
from engine.wire.control import Evaluated, Step

log = logging.getLogger(__name__)
MAX_BATCHES = 64  # a held-out set is scored on its first this many micro-batches


async def score_heldout(task: Task, optimizer: CollaborativeOptimizer, send: SendControl, step: Step) -> None:
    device = optimizer.compute_device

    def measure(model: torch.nn.Module) -> tuple[dict[str, float], int]:
        totals: dict[str, float] = {}
        samples = 0
        for batch in itertools.islice(task.heldout(), MAX_BATCHES):
            batch = batch.to(device)
            for name, value in task.metrics(model, batch).items():
                totals[name] = totals.get(name, 0.0) + value
            samples += batch.size
        return totals, samples

    try:
        scored = await optimizer.evaluate(measure, step.epoch)
    except (OSError, ValueError) as exc:  # the held-out files could not be had
        log.warning("could not score the held-out set: %s", exc)
        return
    if scored is None or not scored[1]:
        return  # the state moved on first, or there is no held-out set
    totals, samples = scored
    accuracy = totals["accuracy"] / samples if "accuracy" in totals else None
    log.info("held-out set at epoch %d: loss %.4f%s over %d samples", step.epoch, totals["loss"] / samples,
             f", accuracy {accuracy:.1%}" if accuracy is not None else "", samples)
    await send(Evaluated(epoch=step.epoch, state_sha256=step.state_sha256,
                                     loss=totals["loss"] / samples, accuracy=accuracy, samples=samples))
