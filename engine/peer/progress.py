"""What a peer tells the backbone of its compute between rounds: Progress reports, the
keep-alive of a slow device, and when the collaboration is likely to reach its target
(then reports go at once, so rounds open without lag)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from msgspec.structs import replace

from engine.training.accumulator import Accumulated
from engine.training.optimizer import CollaborativeOptimizer
from engine.wire.control import ControlMessage, Progress, Status

SendControl = Callable[[ControlMessage], Awaitable[object]]
MIN_REPORT_GAP = 0.05


class ProgressReporter:
    def __init__(self, optimizer: CollaborativeOptimizer, send: SendControl, target_batch_size: int,
                 report_interval: float = 0.5) -> None:
        self.optimizer = optimizer
        self.target_batch_size = target_batch_size
        self.report_interval = report_interval
        self.client_mode: Callable[[], bool] = lambda: False
        # (upload, download) bytes per second the peer's link achieves, None while unmeasured
        self.link_estimate: Callable[[], tuple[float | None, float | None]] = lambda: (None, None)
        self._send = send
        self._last_report = 0.0
        self._reported = (-1, 0)  # (the accumulator's generation, its samples) when last told
        self._stepped_once = False
        self._status: Status | None = None
        self._status_time = 0.0
        self._mine_in_status = 0
        self._taken = asyncio.Event()  # a round took our gradient: a hold is over

    async def report(self, force: bool = False) -> None:
        """Tell the backbone how far we are, if a report is due (or ``force``)."""
        opt = self.optimizer
        if opt.synced and not opt.in_round and (force or self.due()):
            await self._report(opt.accumulator.samples, opt.accumulator.loss_sum,
                               opt.accumulator.compute_seconds)

    def due(self) -> bool:
        """Whether to report now: every ``report_interval``, and at once when the collaboration
        is likely to have reached its target, so rounds open without lag. Until our first
        step, at once too: the pace the backbone measures of us includes our first
        micro-batch (allocations, the first shard read: several of the next ones' time), so
        only fresh counts keep a round's cap of us above what we bring. (Also asked on the
        compute thread after each micro-batch: it only reads.)"""
        if self.optimizer.in_round:
            return False  # (overlapped rounds: what accumulates meanwhile is told after the step)
        now = time.monotonic()
        since = now - self._last_report
        first_of_epoch = self._reported_samples == 0 and self.optimizer.accumulator.samples > 0
        return since >= self.report_interval or first_of_epoch or (
            since >= MIN_REPORT_GAP and (not self._stepped_once or self._target_in_reach(now)))

    def full(self) -> bool:
        """Whether we hold the target ourselves: no step weighs more of us, so a micro-batch
        more could not count. Alone behind rounds that did not settle, a peer once stepped
        38 times the target; peers that computed on while the backbone was away brought
        14,396 samples to a target of 128. (Asked on the compute thread after each
        micro-batch too: it only reads.)"""
        opt = self.optimizer
        return not opt.in_round and opt.accumulator.samples >= self.target_batch_size

    async def until_room(self) -> None:
        """Return once another micro-batch may count: while we hold the target, wait for
        the round that takes it (our count told the backbone at once; the heartbeat
        keeps telling it we are alive), looking again each ``report_interval`` (a resync
        may have emptied the accumulator)."""
        while self.full():
            if self._reported_samples != self.optimizer.accumulator.samples:
                await self.report(force=True)
            self._taken.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._taken.wait(), self.report_interval)

    async def report_taken(self, taken: Accumulated) -> None:
        """What we bring to a round, as the backbone's last evidence before it judges our
        claim. Without it, a peer whose only report this epoch came after a slow first
        micro-batch looks slower than it is, and its honest claim gets cut."""
        self._taken.set()
        if taken.samples:
            await self._report(taken.samples, taken.loss_sum, taken.compute_seconds)

    def stepped(self) -> None:
        self._stepped_once = True

    async def keep_alive(self, interval: float) -> None:
        """Report even when no micro-batch finished lately (a slow device, a small CPU
        share): to the backbone, silence means the peer is gone."""
        if time.monotonic() - self._last_report >= interval:
            await self.report(force=True)

    def observe(self, status: Status) -> None:
        """Remember the collaboration's progress, to estimate when the target is reached."""
        self._status, self._status_time = status, time.monotonic()
        self._mine_in_status = self._reported_samples

    def observe_epoch(self, epoch: int) -> None:
        """A new epoch starts from zero samples; the peers' rates carry over."""
        if self._status is not None and epoch > self._status.epoch:
            self.observe(replace(self._status, epoch=epoch, samples=0))
            self._mine_in_status = 0

    @property
    def _reported_samples(self) -> int:
        """What we last told of the gradient accumulating now (0: nothing yet)."""
        generation, samples = self._reported
        return samples if generation == self.optimizer.generation else 0

    async def _report(self, samples: int, loss_sum: float, compute_seconds: float) -> None:
        opt = self.optimizer
        self._last_report = time.monotonic()
        self._reported = (opt.generation, opt.accumulator.samples)
        loss = loss_sum / samples if samples else None
        upload, download = self.link_estimate()
        await self._send(Progress(opt.epoch, samples, opt.throughput.rate(), loss,
                                  compute_seconds, self.client_mode(), upload, download))

    def _target_in_reach(self, now: float) -> bool:
        status, opt = self._status, self.optimizer
        if status is None or status.epoch != opt.epoch:
            return False
        others = max(status.samples - self._mine_in_status, 0)
        others_rate = max(status.samples_per_second - opt.throughput.rate(), 0.0)
        estimate = others + others_rate * (now - self._status_time) + opt.accumulator.samples
        return estimate >= self.target_batch_size
