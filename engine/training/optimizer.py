"""CollaborativeOptimizer: a torch optimizer stepped by a whole collaboration at once.

Each peer runs micro-batches at its own pace and accumulates gradient sums. When the backbone
opens a round, the peer hands over what it has, the group averages it (weighted by samples),
and every member applies the same averaged gradient with the same optimizer step: synchronous
large-batch training, whoever joined or left. In ``local`` mode (engine/training/local.py)
micro-batches step a local copy instead, and rounds average pseudo-gradients into the outer step.

All torch work (micro-batches, the step, state snapshots) runs on one worker thread, in order,
so a step never overlaps a forward pass and the event loop keeps serving the network.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from functools import partial
from typing import TypeVar

import torch

from engine.averaging.errors import AveragingError
from engine.governor.throttle import ComputeGate, MicroBatchAbandoned
from engine.project import ScheduleSpec
from engine.training.accumulator import Accumulated, GradientAccumulator
from engine.training.compute_copy import follow_master, place
from engine.training.compute_thread import ComputeThread
from engine.training.kept_state import Kept, all_finite, is_finite, keep, put_back
from engine.training.local import LocalSteps
from engine.training.lr_schedule import lr_at
from engine.training.params import set_grads, trainable
from engine.training.state import hold_warm_q, load_state, pack_state, state_sha256, warm_slots
from engine.training.state_hash import StateHash
from engine.training.throughput import Throughput
from engine.wire.tensors import StateFile, StateIndex

T = TypeVar("T")
log = logging.getLogger(__name__)

SNAPSHOT_WAIT = 5.0  # the same for a state snapshot a joiner or a checkpoint waits for
RUN_SECONDS = 0.1  # the longest run of micro-batches between two looks from the event loop


class UnsafeStep(AveragingError):
    """The round's result would make our state non-finite: we do not take it."""

    def __init__(self, message: str) -> None:
        super().__init__(message, set())


class CollaborativeOptimizer:
    """The model, its optimizer and the accumulated gradient of one peer, and the order of
    everything done to them (see the module's docstring): micro-batches between rounds, a
    round's step, a downloaded state, a snapshot."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        schedule: ScheduleSpec,
        *,
        project_id: str,
        clip_grad_norm: float | None = None,
        gate: ComputeGate | None = None,
        compute_device: torch.device | None = None,
        local: LocalSteps | None = None,
        overlap: bool = False,
        warm_shapes: Mapping[int, tuple[int, int]] | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer  # in local mode, the outer one
        self.schedule = schedule
        self.local = local
        self.overlap = overlap  # compute goes on during rounds, on the state before their step
        self.project_id = project_id
        self.clip_grad_norm = clip_grad_norm
        self.params = trainable(model)
        # PowerSGD's warm Q (engine/averaging/powersgd.py): the shape of the slot each
        # compressed matrix may hold in the optimizer state, by index in ``params``.
        self.warm_shapes = dict(warm_shapes or {})
        self.throughput = Throughput()
        self.thread = ComputeThread(gate)
        self.gate = self.thread.gate
        self.accumulator = GradientAccumulator(self.params)
        self.compute_device = compute_device
        self.compute_model = place(model, compute_device, self.gate, local, self.accumulator, overlap)
        stepping = local.inner if local is not None else optimizer
        assert stepping is not None
        self.base_lr = stepping.param_groups[0]["lr"]
        self.epoch = 0
        self._copy_epoch = 0  # the epoch of the state micro-batches run on (overlapped, it may lag)
        self.hash = StateHash()  # of the state held now ("" before any)
        self.kept: Kept | None = None
        # PowerSGD's error feedback: what compression left out of our gradient sums in steps
        # taken, sent again next round. Ours alone, never hashed or served (None: zeros);
        # replaced, never changed in place, on the compute thread while no round of ours runs.
        self.residual: torch.Tensor | None = None
        self._round_over = asyncio.Event()
        self._round_over.set()
        # Counts the gradients accumulated since a step or a sync: one more each time the
        # accumulator starts afresh (so a report tells which gradient its count is of).
        self.generation = 0
        self._synced = False
        self._in_round = False
        self._stepped = False  # the round's step is taken: compute resumes before the round ends
        self.paused = False
        self._computable = asyncio.Event()

    # --- micro-batches -----------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._synced

    @property
    def in_round(self) -> bool:
        return self._in_round

    @property
    def stepped_in_round(self) -> bool:
        """Our step is taken; the round ends once the new state's hash is in (computing on)."""
        return self._in_round and self._stepped

    async def compute_run(self, micro_batch: Callable[[int], tuple[int, float]], first_id: int,
                          report_due: Callable[[], bool]) -> tuple[int, int]:
        """Micro-batches ``first_id``, ``first_id + 1``, ... in one job on the compute thread,
        until a report is due, ``RUN_SECONDS`` pass, or other work waits for the thread (a
        round, a snapshot: they never wait longer than for one micro-batch). A hop to the
        thread and back per micro-batch cost about 0.45 ms, 5% of a small model's. Each
        ``micro_batch(id)`` back-propagates its loss *summed* over its samples and returns
        (samples, summed loss). Returns how many ids it used and how many added a gradient."""
        await self._computable.wait()

        def work() -> tuple[int, int]:
            began, used, added = time.perf_counter(), 0, 0
            while self._computable.is_set():  # (cleared when a round opens or on a pause)
                batch_id = first_id + used
                used += 1
                try:
                    samples, loss_sum = self.thread.timed(partial(micro_batch, batch_id))
                except MicroBatchAbandoned:
                    break  # stopped inside the forward pass: no gradient was added
                self.accumulator.add(samples, loss_sum, batch_id, self.thread.last_micro_batch_seconds,
                                     self._copy_epoch)
                if self.local is not None:
                    self.local.after_micro_batch(samples, lr_at(self.schedule, self.base_lr, self.epoch))
                self.throughput.add(samples)
                added += 1
                if report_due() or self.thread.others_waiting or time.perf_counter() - began >= RUN_SECONDS:
                    break
            return used, added

        return await self.thread.run(work)

    def pause(self, paused: bool) -> None:
        """Start no micro-batch while paused; the one under way stops at its next layer
        (or finishes, if it is already in its backward pass)."""
        self.paused = paused
        self.gate.abandon(paused)
        self._update()

    # --- rounds -----------------------------------------------------------------------

    async def begin_round(self, epoch: int, budget: float) -> Accumulated | None:
        """Stop computing and take what is accumulated, for a round of ``epoch`` (None if
        our state is not that epoch's, or a round is under way). The micro-batch under way
        finishes if it fits in ``budget`` seconds; else it is dropped."""
        if not self._synced or epoch != self.epoch or self._in_round:
            return None
        self._in_round, self._stepped = True, False
        self._round_over.clear()
        self._update()
        def take() -> Accumulated:
            if self.local is not None:
                lr = lr_at(self.schedule, self.base_lr, self.epoch)
                return self.local.take(self.model, self.accumulator, lr)
            taken = self.accumulator.take()
            if self.overlap:  # the next gradient is computed on this state, during the round
                self._follow_master()
            return taken

        taken = await self.thread.run_promptly(take, budget)
        self.generation += 1
        return taken

    async def step(self, vector: torch.Tensor, epoch: int, nonce: str | None,
                   residual: torch.Tensor | None = None,
                   next_q: Mapping[int, torch.Tensor] | None = None,
                   ) -> tuple[Future[str], Future[str | None]]:
        """Take the round's step; the new state's hash and the proof (for ``nonce``) that
        we hold it, both computed beside the next micro-batches. UnsafeStep if the step
        would leave the state not finite. PowerSGD: ``residual`` is the error feedback to
        keep once the step is taken (the one before it is kept with the state before it),
        ``next_q`` the warm Q the new state holds."""
        taken = await self.thread.run(lambda: self._apply(vector, epoch, nonce, residual, next_q))
        # Micro-batches resume on the new state; the round (and so any state that would land
        # under it) ends once its hash is in and RoundDone is ready.
        self._stepped = True
        self._update()
        return taken

    async def give_back(self, taken: Accumulated, epoch: int) -> None:
        """A round of ``epoch`` failed: what it took counts again, if our state is still that
        epoch's."""
        def give_back() -> None:
            if self.local is not None:  # (its progress never left the local copy)
                self.accumulator.restore_counts(taken)
            else:
                self.accumulator.restore(taken)

        if self.epoch == epoch:
            await self.thread.run(give_back)

    def end_round(self) -> None:
        self._in_round = False
        self._round_over.set()
        self._update()

    def keep_taken(self, epoch: int, taken: Accumulated) -> None:
        """What we brought to the step of ``epoch``: if that step is discarded, it counts again."""
        if self.kept is not None and self.kept.epoch == epoch:
            self.kept.taken = taken

    # --- where micro-batches run ----------------------------------------------------------

    async def set_compute_device(self, device: torch.device | None) -> None:
        """Move micro-batches to ``device`` (None: the CPU), keeping what is accumulated."""
        if device != self.compute_device:
            def move() -> None:
                # (overlapped, the copy holds the state the gradient under way is computed on)
                source = self.compute_model if self.overlap else self.model
                self.compute_model = place(source, device, self.gate, self.local, self.accumulator,
                                           self.overlap)
                self.compute_device = device

            await self.thread.run(move)

    def _apply(self, vector: torch.Tensor, epoch: int, nonce: str | None,
               residual: torch.Tensor | None = None,
               next_q: Mapping[int, torch.Tensor] | None = None) -> tuple[Future[str], Future[str | None]]:
        """Take the step. Whatever the round delivered, a state that is not finite is never
        taken: the step is refused (UnsafeStep) and the state stays as it was."""
        if not all_finite([vector]):
            raise UnsafeStep("the averaged gradient is not finite: refusing the step")
        self.hash.before_change(step=True)
        copied = self.hash.copy(epoch)
        if self.kept is None or self.kept.epoch != epoch:  # else that older state is still unsettled
            self.kept = copied or keep(self.model, self.optimizer, epoch, self.hash.value)
            self.kept.residual = self.residual
        set_grads(self.params, vector)
        if self.local is None:  # the outer step takes the pseudo-gradient as it is, at its own lr
            if self.clip_grad_norm:
                torch.nn.utils.clip_grad_norm_(self.params, self.clip_grad_norm)
            lr = lr_at(self.schedule, self.base_lr, epoch)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        hold_warm_q(self.optimizer, self.params, self.warm_shapes, next_q or {})
        if not is_finite(self.model, self.optimizer):
            put_back(self.kept, self.model, self.optimizer)
            self.kept = None
            raise UnsafeStep("the step would make the model's state not finite: refusing it")
        self.residual = residual  # (taken: what our parts left out waits for the next round)
        hashing = self.hash.start(self.model, self.optimizer, epoch + 1, self.params, nonce)
        # (the new epoch shows once its hash is the current one: a settlement or resync of
        # it seen meanwhile is checked against that hash, never the one before the step)
        self.epoch = epoch + 1
        if not self.overlap:  # (overlapped, the copy takes it when the next round takes the gradient)
            self._follow_master()
        return hashing

    # --- state ------------------------------------------------------------------------

    def unsync(self) -> None:
        """Stop computing: our state is stale and must be downloaded again."""
        self._synced = False
        self._update()

    async def snapshot(self) -> tuple[StateIndex, bytearray]:
        """The current state as a bundle. Steps also run on the compute thread, so the
        epoch read there always matches the parameters packed."""
        return await self.thread.run_promptly(
            lambda: pack_state(self.model, self.optimizer, self.epoch, self.project_id), SNAPSHOT_WAIT
        )

    async def reset(self, fresh: torch.nn.Module) -> str:
        """Start over from ``fresh`` (a newly initialised model) at epoch 0."""
        def work() -> str:
            self.hash.before_change()
            self.model.load_state_dict(fresh.state_dict())
            self.optimizer.state.clear()
            self.epoch, self.kept, self.residual = 0, None, None
            self._follow_master()
            return self._rehash()

        return await self.thread.run(work)

    async def load(self, state: StateFile) -> str:
        """Adopt a downloaded state (checked by the caller); returns its hash."""
        def work() -> str:
            self.hash.before_change()
            warm = warm_slots(self.optimizer, self.params, self.warm_shapes)
            self.epoch = load_state(state, self.model, self.optimizer, self.project_id, warm)
            self._follow_master()
            # Our error feedback is left out of what we computed on states we no longer
            # hold, as the accumulator's gradient is (mark_synced clears it): both go.
            self.kept, self.residual = None, None
            return self._rehash()

        return await self.thread.run(work)

    def settled(self, epoch: int, digest: str) -> None:
        """The collaboration settled on ``epoch`` with this state: if it is ours, the state
        kept from before our last step is no longer needed."""
        hashed = self.hash.current
        if not hashed.done():  # (checked once it is, rather than holding the event loop)
            asyncio.wrap_future(hashed).add_done_callback(lambda _: self.settled(epoch, digest))
        elif hashed.exception() is None and epoch == self.epoch and digest == hashed.result():
            if self.kept is not None and self.kept.epoch < epoch:  # (not one a step under way just took)
                self.kept = None
            self.hash.settled(hashed)

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
            self.hash.before_change()
            put_back(kept, self.model, self.optimizer)
            self.hash.set(kept.state_sha256)
            self.epoch, self.kept = kept.epoch, None
            self.residual = kept.residual  # the step is undone: so is what it left for later
            self._follow_master()
            self.accumulator.clear()
            if kept.taken is not None and self.local is not None:
                self.local.restore(self.model, kept.taken, self.accumulator)
            elif kept.taken is not None:
                self.accumulator.restore(kept.taken)
            return True

        if not await self.thread.run(work):
            return False
        self.generation += 1
        self._synced = True
        self._update()
        return True

    async def round_over(self) -> None:
        """Until no round of ours is under way: state must not land under a round's step."""
        await self._round_over.wait()

    def _follow_master(self) -> None:
        """(On the thread.) Micro-batches run on the state held now, from here on."""
        follow_master(self.model, self.compute_model, self.local)
        self._copy_epoch = self.epoch

    def _rehash(self) -> str:
        """The hash of the whole state a joiner would receive: parameters, optimizer state,
        epoch (after a download or a reset, at once; after a step, beside compute)."""
        self.hash.set(state_sha256(self.model, self.optimizer, self.epoch))
        return self.hash.value

    async def mark_synced(self) -> None:
        await self.thread.run(self.accumulator.clear)
        self.generation += 1
        self._synced = True
        self._update()

    def _update(self) -> None:
        if self._synced and (self.overlap or not self._in_round or self._stepped) and not self.paused:
            self._computable.set()
        else:
            self._computable.clear()

    async def evaluate(self, measure: Callable[[torch.nn.Module], T], epoch: int) -> T | None:
        """``measure(model)`` on the compute thread between micro-batches, in evaluation mode
        and without gradients; None if the state is no longer that of ``epoch``."""
        def work() -> T | None:
            if self.epoch != epoch:
                return None
            model = self.model if self.overlap else self.compute_model  # (an overlapped copy lags)
            model.eval()
            try:
                with torch.no_grad():
                    return measure(model)
            finally:
                model.train()

        return await self.thread.run(work)
