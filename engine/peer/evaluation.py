"""Scoring the project's held-out set on a settled state, for the learning curve: the
members a step chose (engine/evaluators.py) score the state they hold and tell the backbone.

The scoring shares the compute thread with training, snapshots and rounds, and gives way to
the work they wait for: it runs in pieces, each ending when a snapshot or a round waits for
the thread, and a batch that such work cut short is scored again in the next piece. A
snapshot leaves the state as it was, so the scoring goes on after it; a step moves the
state, and the scoring of the old one ends.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

import torch

from engine.governor.throttle import MicroBatchAbandoned
from engine.peer.progress import SendControl
from engine.tasks import Task
from engine.tasks.base import Batch
from engine.training.optimizer import CollaborativeOptimizer
from engine.wire.control import Evaluated, Step

log = logging.getLogger(__name__)
MAX_BATCHES = 64  # a held-out set is scored on its first this many micro-batches
# Pieces in a row that scored nothing (each cut inside its first batch, or the computer's
# limits paused it) before this scoring is given up: the next chosen step scores again.
MAX_IDLE_PIECES = 3


class HeldoutScore:
    """Loss and metrics summed over the held-out batches scored so far."""

    def __init__(self, task: Task, device: torch.device | None, waiting: Callable[[], bool]) -> None:
        self.task, self.device, self.waiting = task, device, waiting
        self.batches = itertools.islice(task.heldout(), MAX_BATCHES)
        self.current: Batch | None = None  # the batch under way, kept when it is cut short
        self.totals: dict[str, float] = {}
        self.samples = 0
        self.done = False

    def score_some(self, model: torch.nn.Module) -> int:
        """(On the compute thread.) Score batches until all are, or other work waits; returns
        how many were scored in this piece."""
        scored = 0
        while not self.waiting() or scored == 0:
            if self.current is None:
                self.current = next(self.batches, None)
                if self.current is None:
                    self.done = True
                    return scored
            try:
                metrics = self.task.metrics(model, self.current.to(self.device))
            except MicroBatchAbandoned:
                return scored  # a snapshot or a round could not wait: this batch again later
            for name, value in metrics.items():
                self.totals[name] = self.totals.get(name, 0.0) + value
            self.samples += self.current.size
            self.current = None
            scored += 1
        return scored


async def score_heldout(task: Task, optimizer: CollaborativeOptimizer, send: SendControl, step: Step) -> None:
    try:
        score = HeldoutScore(task, optimizer.compute_device, lambda: optimizer.thread.prompt_waiting)
        idle = 0
        while not score.done and idle < MAX_IDLE_PIECES:
            scored = await optimizer.evaluate(score.score_some, step.epoch)
            if scored is None:
                log.info("the held-out set was not scored at epoch %d: the next step came first", step.epoch)
                return
            idle = 0 if scored else idle + 1
    except (OSError, ValueError) as exc:  # the held-out files could not be had
        log.warning("could not score the held-out set: %s", exc)
        return
    if not score.done:
        log.info("the held-out set was not scored at epoch %d: other work kept cutting it short", step.epoch)
        return
    if not score.samples:
        return  # no held-out set
    totals, samples = score.totals, score.samples
    accuracy = totals["accuracy"] / samples if "accuracy" in totals else None
    log.info("held-out set at epoch %d: loss %.4f%s over %d samples", step.epoch, totals["loss"] / samples,
             f", accuracy {accuracy:.1%}" if accuracy is not None else "", samples)
    await send(Evaluated(epoch=step.epoch, state_sha256=step.state_sha256,
                         loss=totals["loss"] / samples, accuracy=accuracy, samples=samples))
