"""CollaborativeOptimizer: a torch optimizer stepped by a whole collaboration at once.

Each peer runs micro-batches at its own pace and accumulates gradient sums. When the
backbone opens a round, the peer hands over what it has, the group averages it
(weighted by samples), and every member applies the same averaged gradient with the
same optimizer step: synchronous large-batch training, whoever joined or left. In
``local`` mode (engine/training/local.py) micro-batches step a local copy instead, and
rounds average pseudo-gradients into the outer step.

All torch work (micro-batches, the step, state snapshots) runs on one worker thread, in
order, so a step never overlaps a forward pass and the event loop keeps serving the network.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from msgspec.structs import replace

from engine.averaging.allreduce import Averaged, AveragingError, RoundPlan
from engine.governor.throttle import ComputeGate, MicroBatchAbandoned
from engine.project import AggregationSpec, CompressionMethod, ScheduleSpec
from engine.training.accumulator import Accumulated, GradientAccumulator
from engine.training.local import LocalSteps
from engine.training.lr_schedule import lr_at
from engine.training.params import copy_weights, set_grads, state_proof, trainable
from engine.training.state import load_state, pack_state, state_sha256
from engine.training.throughput import Throughput
from engine.wire.control import ControlMessage, Progress, RoundDone, RoundStart, Status, Step
from engine.wire.tensors import StateFile, StateIndex

T = TypeVar("T")
log = logging.getLogger(__name__)

Averager = Callable[[RoundPlan, torch.Tensor, int, float, float], Awaitable[Averaged]]
Send = Callable[[ControlMessage], Awaitable[object]]
MicroBatch = Callable[[], tuple[int, float]]
MIN_REPORT_GAP = 0.05
# A round waits for the micro-batch under way only while the rest of it fits in this share
# of the round's timeout; a slower device drops that micro-batch instead of stalling everyone.
ROUND_WAIT_SHARE = 0.2
SNAPSHOT_WAIT = 5.0  # the same for a state snapshot a joiner or a checkpoint waits for


class UnsafeStep(AveragingError):
    """The round's result would make our state non-finite: we do not take it."""

    def __init__(self, message: str) -> None:
        super().__init__(message, set())


@dataclass
class Kept:
    """The state before a step the collaboration has not settled on yet: if the round is
    discarded, the peer goes back to it at once instead of downloading it."""

    epoch: int
    state_sha256: str
    model: dict[str, torch.Tensor]
    optimizer: dict[int, Any]
    taken: Accumulated | None = None  # what we brought to the step: computed on this state


class CollaborativeOptimizer:
    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        schedule: ScheduleSpec,
        *,
        project_id: str,
        me: str,
        averager: Averager,
        send: Send,
        target_batch_size: int,
        aggregation: AggregationSpec | None = None,
        compression: CompressionMethod = "none",
        clip_grad_norm: float | None = None,
        report_interval: float = 0.5,
        executor: ThreadPoolExecutor | None = None,
        gate: ComputeGate | None = None,
        compute_device: torch.device | None = None,
        local: LocalSteps | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer  # in local mode, the outer one
        self.schedule = schedule
        self.local = local
        self.project_id = project_id
        self.me = me
        self.clip_grad_norm = clip_grad_norm
        self.report_interval = report_interval
        self.target_batch_size = target_batch_size
        self.aggregation = aggregation or AggregationSpec()
        self.compression = compression
        self.params = trainable(model)
        self.throughput = Throughput()
        self.executor = executor or ThreadPoolExecutor(1, thread_name_prefix="cotrain-compute")
        self.gate = gate or ComputeGate()
        self.compute_device: torch.device | None = None
        self.compute_model = model
        self.accumulator = GradientAccumulator(self.params)
        self._place(compute_device)
        stepping = local.inner if local is not None else optimizer
        assert stepping is not None
        self.base_lr = stepping.param_groups[0]["lr"]
        self.client_mode: Callable[[], bool] = lambda: False
        # (upload, download) bytes per second the peer's link achieves, None while unmeasured
        self.link_estimate: Callable[[], tuple[float | None, float | None]] = lambda: (None, None)
        self._busy = False
        self._batch_began: float | None = None  # when the micro-batch under way started
        self._outlasted_wait = False
        self.epoch = 0
        self.state_hash = ""  # of the state held now ("" before any)
        self.kept: Kept | None = None
        self._round_over = asyncio.Event()
        self._round_over.set()
        self.last_compute_seconds = 0.0
        self.last_step: RoundDone | None = None  # how our last step went, told the backbone again
        self._averager = averager
        self._send = send
        self._synced = False
        self._in_round = False
        self._paused = False
        self._computable = asyncio.Event()
        self._last_report = 0.0
        self._reported_samples = 0
        self._stepped_once = False
        self._status: Status | None = None
        self._status_time = 0.0
        self._mine_in_status = 0

    # --- micro-batches -----------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._synced

    @property
    def in_round(self) -> bool:
        return self._in_round

    async def compute(self, micro_batch: MicroBatch, batch_id: int) -> None:
        """Run ``micro_batch`` on the compute thread: it back-propagates the loss *summed*
        over its samples (mean loss x samples) and returns (samples, summed loss)."""
        await self._computable.wait()

        def work() -> bool:
            if not self._computable.is_set():
                return False  # a round opened (or a pause) while this one waited in the queue
            began = self._batch_began = time.perf_counter()
            try:
                samples, loss_sum = micro_batch()
            except MicroBatchAbandoned:
                return False  # stopped inside the forward pass: no gradient was added
            finally:
                self._batch_began = None
            self.last_compute_seconds = time.perf_counter() - began
            self._outlasted_wait = False
            self.accumulator.add(samples, loss_sum, batch_id, self.last_compute_seconds)
            if self.local is not None:
                self.local.after_micro_batch(samples, self._lr())
            self.throughput.add(samples)
            return True

        if await self._run(work):
            await self.report_progress()

    async def report_progress(self, force: bool = False) -> None:
        """Tell the backbone how far we are: every ``report_interval``, and at once when the
        collaboration is likely to have reached its target, so rounds open without lag.
        Until our first step, at once too: the pace the backbone measures of us includes our
        first micro-batch (allocations, the first shard read: several of the next ones' time),
        so only fresh counts keep a round's cap of us above what we bring."""
        now = time.monotonic()
        since = now - self._last_report
        first_of_epoch = self._reported_samples == 0 and self.accumulator.samples > 0
        due = since >= self.report_interval or first_of_epoch or (
            since >= MIN_REPORT_GAP and (not self._stepped_once or self._target_in_reach(now)))
        if not self._synced or self._in_round or not (force or due):
            return
        self._reported_samples = self.accumulator.samples
        await self._report(self.accumulator.samples, self.accumulator.loss_sum,
                           self.accumulator.compute_seconds)

    async def _report(self, samples: int, loss_sum: float, compute_seconds: float) -> None:
        self._last_report = time.monotonic()
        loss = loss_sum / samples if samples else None
        upload, download = self.link_estimate()
        await self._send(Progress(self.epoch, samples, self.throughput.rate(), loss,
                                  compute_seconds, self.client_mode(), upload, download))

    async def keep_alive(self, interval: float) -> None:
        """Report even when no micro-batch finished lately (a slow device, a small CPU
        share): to the backbone, silence means the peer is gone."""
        if time.monotonic() - self._last_report >= interval:
            await self.report_progress(force=True)

    def observe(self, status: Status) -> None:
        """Remember the collaboration's progress, to estimate when the target is reached."""
        self._status, self._status_time = status, time.monotonic()
        self._mine_in_status = self._reported_samples

    def observe_epoch(self, epoch: int) -> None:
        """A new epoch starts from zero samples; the peers' rates carry over."""
        if self._status is not None and epoch > self._status.epoch:
            self.observe(replace(self._status, epoch=epoch, samples=0))
            self._mine_in_status = 0

    def _target_in_reach(self, now: float) -> bool:
        status = self._status
        if status is None or status.epoch != self.epoch:
            return False
        others = max(status.samples - self._mine_in_status, 0)
        others_rate = max(status.samples_per_second - self.throughput.rate(), 0.0)
        estimate = others + others_rate * (now - self._status_time) + self.accumulator.samples
        return estimate >= self.target_batch_size

    def pause(self, paused: bool) -> None:
        """Start no micro-batch while paused; the one under way stops at its next layer
        (or finishes, if it is already in its backward pass)."""
        self._paused = paused
        self.gate.abandon(paused)
        self._update()

    @property
    def paused(self) -> bool:
        return self._paused

    async def set_threads(self, threads: int) -> None:
        await self._run(lambda: torch.set_num_threads(threads))

    # --- rounds -----------------------------------------------------------------------

    async def run_round(self, start: RoundStart) -> tuple[Step, Accumulated] | None:
        """Take part in the round ``start``; returns the step taken and what this peer brought
        to it, or None if the round failed."""
        if self.me not in start.group:
            return None
        if not self._synced or start.epoch != self.epoch or self._in_round:
            await self._send(RoundDone(start.round_id, start.epoch, ok=False,
                                       error=f"not ready for epoch {start.epoch}"))
            return None
        self._in_round = True
        self._round_over.clear()
        self._update()
        taken = await self._run_promptly(self._take, ROUND_WAIT_SHARE * start.timeout)
        self._reported_samples = 0
        if taken.samples:
            # What we bring to the round, as the backbone's last evidence before it judges
            # our claim. Without it, a peer whose only report this epoch came after a slow
            # first micro-batch looks slower than it is, and its honest claim gets cut.
            await self._report(taken.samples, taken.loss_sum, taken.compute_seconds)
        began = time.monotonic()
        plan = RoundPlan.of(start, self.me, self.aggregation, self.target_batch_size, self.compression)
        try:
            try:
                averaged = await self._averager(plan, taken.vector, taken.samples, taken.loss_sum,
                                                start.timeout)
                digest, proof = await self._run(lambda: self._stepped(averaged.vector, start))
            except AveragingError as exc:
                log.warning("round for epoch %d failed: %s", start.epoch, exc)
                if self.epoch == start.epoch:
                    await self._run(lambda: self._give_back(taken))
                await self._send(RoundDone(start.round_id, start.epoch, ok=False, error=str(exc),
                                           unreachable=exc.suspects, waiting=exc.waiting))
                return None
        finally:
            self._in_round = False
            self._round_over.set()
            self._update()
        seconds = time.monotonic() - began
        if self.kept is not None and self.kept.epoch == start.epoch:
            self.kept.taken = taken
        self.last_step = RoundDone(start.round_id, start.epoch, ok=True, state_sha256=digest,
                                   samples=averaged.samples, loss=averaged.loss, seconds=seconds,
                                   received=averaged.received, commitment=averaged.commitment,
                                   numel=averaged.vector.numel(), proof=proof)
        await self._send(self.last_step)
        self._stepped_once = True
        step = Step(epoch=self.epoch, round_id=start.round_id, loss=averaged.loss, samples=averaged.samples,
                    peers=len(start.group), round_seconds=seconds, state_sha256=digest)
        return step, taken

    def _lr(self) -> float:
        """The learning rate of this epoch's steps (in local mode, of its inner steps)."""
        return lr_at(self.schedule, self.base_lr, self.epoch)

    def _take(self) -> Accumulated:
        if self.local is not None:
            return self.local.take(self.model, self.accumulator, self._lr())
        return self.accumulator.take()

    def _give_back(self, taken: Accumulated) -> None:
        """What a failed round took counts again (in local mode its progress never left
        the local copy)."""
        if self.local is not None:
            self.accumulator.restore_counts(taken)
        else:
            self.accumulator.restore(taken)

    async def _run_promptly(self, fn, budget: float):
        """Run ``fn`` on the compute thread right after the micro-batch under way, like a
        training loop that checks for work between micro-batches -- unless the rest of that
        micro-batch would take more than ``budget`` seconds: then it stops at its next layer
        and its gradient is not added. A slow device never keeps a round or a joiner waiting."""
        job = asyncio.ensure_future(self._run(fn))
        began = self._batch_began
        if began is None:
            return await job
        remaining = self.last_compute_seconds - (time.perf_counter() - began)
        if self._outlasted_wait or remaining > budget:
            self.gate.cut_short()
        else:
            try:
                return await asyncio.wait_for(asyncio.shield(job), budget)
            except asyncio.TimeoutError:
                # Until one finishes, assume the next micro-batch will not fit either.
                self._outlasted_wait = True
                self.gate.cut_short()
        log.info("dropping the micro-batch under way rather than keep the collaboration waiting")
        return await job

    # --- where micro-batches run ----------------------------------------------------------

    async def set_compute_device(self, device: torch.device | None) -> None:
        """Move micro-batches to ``device`` (None: the CPU), keeping what is accumulated."""
        if device != self.compute_device:
            await self._run(lambda: self._place(device))

    def _place(self, device: torch.device | None) -> None:
        """The master weights and the optimizer stay on the CPU in fp32, so every peer takes
        the step with the same kernels and gets the same bits, whatever its hardware. On a
        GPU, micro-batches run on a copy of the model, whose weights follow the master after
        every step and whose gradients are gathered for each round."""
        old = self.accumulator.params
        # The memo keeps the gate itself: the copy's pause and duty-cycle hooks call it.
        memo: dict = {id(self.gate): self.gate}
        if self.local is not None:  # micro-batches step a copy, wherever they run
            compute = self.local.place(self.model, device, memo)
        elif device is None:
            compute = self.model
        else:
            compute = copy.deepcopy(self.model, memo).to(device)
        new = trainable(compute)
        for fresh, previous in zip(new, old, strict=True):
            grad = previous.grad
            if fresh is not previous:
                fresh.grad = grad.to(fresh.device) if grad is not None else None
                previous.grad = None
        self.compute_model, self.compute_device = compute, device
        self.accumulator.params = new

    def _follow_master(self) -> None:
        if self.local is not None:
            self.local.restart(self.model)
        elif self.compute_model is not self.model:
            copy_weights(self.model, self.compute_model)

    def _stepped(self, vector: torch.Tensor, start: RoundStart) -> tuple[str, str | None]:
        """Take the round's step; the new state's hash, and the proof that we hold it."""
        digest = self._apply(vector, start.epoch)
        return digest, state_proof(self.params, start.nonce) if start.nonce else None

    def _apply(self, vector: torch.Tensor, epoch: int) -> str:
        """Take the step. Whatever the round delivered, a state that is not finite is never
        taken: the step is refused (UnsafeStep) and the state stays as it was."""
        if not bool(torch.isfinite(vector).all()):
            raise UnsafeStep("the averaged gradient is not finite: refusing the step")
        if self.kept is None or self.kept.epoch != epoch:  # else that older state is still unsettled
            model = {k: v.clone() for k, v in self.model.state_dict().items()}
            moments = copy.deepcopy(self.optimizer.state_dict()["state"])
            self.kept = Kept(epoch, self.state_hash, model, moments)
        set_grads(self.params, vector)
        if self.local is None:  # the outer step takes the pseudo-gradient as it is, at its own lr
            if self.clip_grad_norm:
                torch.nn.utils.clip_grad_norm_(self.params, self.clip_grad_norm)
            lr = lr_at(self.schedule, self.base_lr, epoch)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if not all(bool(torch.isfinite(t).all()) for t in self._state_tensors()):
            kept = self.kept
            self.model.load_state_dict(kept.model)
            groups = self.optimizer.state_dict()["param_groups"]
            self.optimizer.load_state_dict({"state": kept.optimizer, "param_groups": groups})
            self.kept = None
            raise UnsafeStep("the step would make the model's state not finite: refusing it")
        self._follow_master()
        self.epoch = epoch + 1
        return self._rehash()

    def _state_tensors(self) -> Iterator[torch.Tensor]:
        yield from (p.detach() for p in self.model.parameters())
        for slots in self.optimizer.state.values():
            yield from (t for t in slots.values() if isinstance(t, torch.Tensor) and t.is_floating_point())

    # --- state ------------------------------------------------------------------------

    def unsync(self) -> None:
        """Stop computing: our state is stale and must be downloaded again."""
        self._synced = False
        self._update()

    async def snapshot(self) -> tuple[StateIndex, bytearray]:
        """The current state as a bundle. Steps also run on the compute thread, so the
        epoch read there always matches the parameters packed."""
        return await self._run_promptly(
            lambda: pack_state(self.model, self.optimizer, self.epoch, self.project_id), SNAPSHOT_WAIT
        )

    async def reset(self, fresh: torch.nn.Module) -> str:
        """Start over from ``fresh`` (a newly initialised model) at epoch 0."""
        def work() -> str:
            self.model.load_state_dict(fresh.state_dict())
            self.optimizer.state.clear()
            self._follow_master()
            self.epoch, self.kept = 0, None
            return self._rehash()

        return await self._run(work)

    async def load(self, state: StateFile) -> str:
        """Adopt a downloaded state (checked by the caller); returns its hash."""
        def work() -> str:
            self.epoch = load_state(state, self.model, self.optimizer, self.project_id)
            self._follow_master()
            self.kept = None
            return self._rehash()

        return await self._run(work)

    def settled(self, epoch: int, digest: str) -> None:
        """The collaboration settled on ``epoch`` with this state: if it is ours, the state
        kept from before our last step is no longer needed."""
        if epoch == self.epoch and digest == self.state_hash:
            self.kept = None

    async def restore(self, epoch: int, digest: str) -> bool:
        """Go back to the state kept from before a step that did not settle, if it is the
        settled state of ``epoch``, and resume computing (the gradient we brought to that
        step was computed on this state: it waits for the round that replaces it; what was
        computed on the discarded state is dropped); False when there is none such (then
        download it)."""
        def work() -> bool:
            kept = self.kept
            if kept is None or kept.epoch != epoch or kept.state_sha256 != digest:
                return False
            self.model.load_state_dict(kept.model)
            groups = self.optimizer.state_dict()["param_groups"]
            self.optimizer.load_state_dict({"state": kept.optimizer, "param_groups": groups})
            self._follow_master()
            self.epoch, self.state_hash, self.kept = kept.epoch, kept.state_sha256, None
            self.accumulator.clear()
            if kept.taken is not None and self.local is not None:
                self.local.restore(self.model, kept.taken, self.accumulator)
            elif kept.taken is not None:
                self.accumulator.restore(kept.taken)
            return True

        if not await self._run(work):
            return False
        self._reported_samples = 0
        self._synced = True
        self._update()
        return True

    async def round_over(self) -> None:
        """Until no round of ours is under way: state must not land under a round's step."""
        await self._round_over.wait()

    def _rehash(self) -> str:
        """The hash of the whole state a joiner would receive: parameters, optimizer state,
        epoch (computed after every change, on the compute thread)."""
        self.state_hash = state_sha256(self.model, self.optimizer, self.epoch)
        return self.state_hash

    async def mark_synced(self) -> None:
        await self._run(self.accumulator.clear)
        self._reported_samples = 0
        self._synced = True
        self._update()

    def _update(self) -> None:
        if self._synced and not self._in_round and not self._paused:
            self._computable.set()
        else:
            self._computable.clear()

    @property
    def computing(self) -> bool:
        """Whether the compute thread is busy right now."""
        return self._busy

    async def evaluate(self, measure: Callable[[torch.nn.Module], T], epoch: int) -> T | None:
        """``measure(model)`` on the compute thread between micro-batches, in evaluation mode
        and without gradients; None if the state is no longer that of ``epoch``."""
        def work() -> T | None:
            if self.epoch != epoch:
                return None
            model = self.compute_model
            model.eval()
            try:
                with torch.no_grad():
                    return measure(model)
            finally:
                model.train()

        return await self._run(work)

    async def _run(self, fn):
        def gated():
            self._busy = True
            self.gate.enter()
            try:
                return fn()
            finally:
                self.gate.leave()
                self._busy = False

        return await asyncio.get_running_loop().run_in_executor(self.executor, gated)
