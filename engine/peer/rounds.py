"""A peer's part in averaging rounds: the frames of the data plane, the all-reduce, the step,
and the checkpoint the backbone may ask for afterwards.

A step counts once the collaboration settles on it (the backbone's Step names our hash):
only then is it shown, kept in the history and, if asked, checkpointed. A step the
collaboration did not settle on is undone by the Resync that follows."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import torch
from msgspec.structs import replace

from engine.aio import finished_within
from engine.averaging.allreduce import round_key
from engine.averaging.errors import AveragingError
from engine.averaging.powersgd import Layout
from engine.averaging.round_kinds import PowerSGDInputs, average_round
from engine.averaging.round_plan import RoundChanges, RoundPlan
from engine.averaging.tensor_parts import Averaged
from engine.evaluators import evaluators
from engine.peer.bandwidth import Bandwidth
from engine.peer.checking import Audits, input_key
from engine.peer.client import BackboneError, ControlClient
from engine.peer.evaluation import score_heldout
from engine.peer.events import EpochCompleted, PeerEvent, RoundFailed
from engine.peer.options import PeerOptions
from engine.peer.round_pipeline import RoundPipeline
from engine.peer.state_sync import StateSync
from engine.planning.slot_reducers import exchanges_with
from engine.project import ProjectSpec
from engine.tasks import Task
from engine.training.optimizer import CollaborativeOptimizer
from engine.training.state import warm_q
from engine.transport.mailbox import Key, Kind, Mailbox
from engine.transport.mesh import PeerMesh
from engine.wire.control import Reassign, RoundStart, Step
from engine.wire.frames import Input, Part, Result, Shown, StateReply, StateRequest, StateUnavailable
from engine.wire.framing import Frame, Incoming
from engine.wire.tensors import encode_file

log = logging.getLogger(__name__)

# How long a checkpoint's snapshot, taken a step past the one asked for (rounds outran the
# snapshot), waits for the collaboration to settle on its step before it is uploaded.
SETTLE_PATIENCE = 120.0


class RoundingPeer(Protocol):
    """What a peer's rounds need of it."""

    peer_id: str
    options: PeerOptions
    client: ControlClient
    mailbox: Mailbox
    audits: Audits
    bandwidth: Bandwidth
    history: list[EpochCompleted]
    emit: Callable[[PeerEvent], None]
    spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task]
    chore: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task]
    track: Callable[[asyncio.Task], None]

    @property
    def project(self) -> ProjectSpec: ...

    @property
    def task(self) -> Task: ...

    @property
    def mesh(self) -> PeerMesh: ...

    @property
    def optimizer(self) -> CollaborativeOptimizer: ...

    @property
    def pipeline(self) -> RoundPipeline: ...

    @property
    def state_sync(self) -> StateSync: ...

    def check_behind(self) -> None: ...

    def stop(self, reason: str = "stopped") -> None: ...


class Rounds:
    def __init__(self, peer: RoundingPeer) -> None:
        self.peer = peer
        self.uploads: set[asyncio.Task] = set()
        self._last_round = 0
        # Our step, who checkpoints it, the round's trainers (engine/evaluators.py picks among them).
        self._unsettled: tuple[EpochCompleted, str | None, list[str]] | None = None
        self._settled: Step | None = None  # the last step the collaboration settled on
        self._step_heard = asyncio.Event()
        self._changes: dict[int, RoundChanges] = {}  # members lost midway, by round (Reassign)
        self._layout: Layout | None = None  # PowerSGD's view of the model's gradient
        self._ended_at = 0.0  # (monotonic) when our last round ended

    def layout(self) -> Layout:
        """How PowerSGD compresses this model's gradient: from the trainable parameters'
        shapes (an auxiliary peer builds the same from the task on the meta device)."""
        if self._layout is None:
            shapes = [tuple(p.shape) for p in self.peer.optimizer.params]
            self._layout = Layout.of(shapes, self.peer.project.powersgd.rank)
        return self._layout

    def _powersgd(self) -> PowerSGDInputs:
        opt, layout = self.peer.optimizer, self.layout()
        return PowerSGDInputs(layout, opt.residual, self.peer.project.seed,
                              warm_q(opt.optimizer, opt.params, (m.param for m in layout.matrices)))

    async def average(self, plan: RoundPlan, vector: torch.Tensor, samples: int, loss_sum: float,
                      timeout: float) -> Averaged:
        peer = self.peer
        before, began = peer.mesh.totals(), time.monotonic()
        plan.changes = self._changes.setdefault(plan.round_id, RoundChanges())
        try:
            powersgd = self._powersgd() if plan.phases > 1 else None
            averaged = await average_round(plan, vector, samples, loss_sum, peer.mesh, timeout, powersgd)
            peer.audits.keep(averaged.reduced)
            moved = peer.mesh.totals()
            peer.bandwidth.observed(moved.bytes_sent - before.bytes_sent,
                                    moved.bytes_received - before.bytes_received, time.monotonic() - began)
            return averaged
        except AveragingError as exc:
            # A NAT that rebound or a relay that restarted leaves a link that looks open and
            # carries nothing: renegotiate it through the backbone next time it is needed.
            for suspect in exc.suspects:
                peer.spawn(peer.mesh.drop(suspect))
            raise

    async def run(self, start: RoundStart) -> None:
        peer = self.peer
        if start.groups is not None and peer.peer_id in start.group:
            # Links no round has used since our last are those of an earlier plan: a
            # member holds its group's and its slot's, not every plan's it was ever in.
            needed = exchanges_with(start.groups.groups, start.groups.reducers, peer.peer_id)
            peer.mesh.close_idle(needed, self._ended_at)
        outcome = await peer.pipeline.run(start)
        self._ended_at = time.monotonic()
        self._last_round = max(self._last_round, start.round_id)
        self._changes = {r: c for r, c in self._changes.items() if r > self._last_round}
        peer.mailbox.discard(self._current)
        if outcome is None:
            if peer.peer_id in start.group:
                peer.emit(RoundFailed(start.epoch, "averaging failed"))
            peer.check_behind()
            return
        step, taken = outcome.step, outcome.taken
        completed = EpochCompleted(step=step, my_samples=outcome.mine, my_batches=taken.batches,
                                   computed_on=taken.computed_on,
                                   paths={p: link.path for p, link in peer.mesh.open_links().items()},
                                   averaging_seconds=step.round_seconds,
                                   averaging_began=time.time() - step.round_seconds,
                                   took_seconds=outcome.took_seconds,
                                   first_byte_seconds=outcome.first_byte_seconds)
        trainers = [p for p in start.group if p not in start.auxiliary]
        self._unsettled = (completed, start.checkpoint_by, trainers)
        self._confirm()

    def reassign(self, msg: Reassign) -> None:
        """Members of a round left midway: the round (under way, or about to start) hears."""
        if msg.round_id > self._last_round:
            self._changes.setdefault(msg.round_id, RoundChanges()).update(msg.lost, msg.reducers)

    def _current(self, key: Key) -> bool:
        """Whether a waiting frame may still be wanted: parts and results of rounds to come,
        the inputs of a check of the last round (they come after it)."""
        if key.kind in ("part", "result", "shown"):
            return key.id > self._last_round
        return key.id >= self._last_round if key.kind == "input" else True

    def settled(self, step: Step) -> None:
        """The collaboration settled on ``step``: if it is ours, it counts now."""
        self._settled = step
        self._step_heard.set()
        self._confirm()

    def undone(self) -> None:
        """The backbone says our state is not the collaboration's: our last step is void."""
        self._unsettled = None

    def _confirm(self) -> None:
        settled, pending = self._settled, self._unsettled
        if settled is None or pending is None or settled.epoch < pending[0].step.epoch:
            return
        self._unsettled = None
        completed, checkpoint_by, trainers = pending
        if settled.epoch != completed.step.epoch or settled.state_sha256 != completed.step.state_sha256:
            return  # not what the collaboration settled on: a Resync undoes it
        peer = self.peer
        completed = replace(completed, step=settled)
        peer.history.append(completed)
        peer.emit(completed)
        # The checkpoint's snapshot first: it then waits for no held-out batch.
        if checkpoint_by == peer.peer_id:
            what = f"uploading the checkpoint of epoch {settled.epoch}"
            self.uploads.add(peer.chore(self._upload_checkpoint(), what))
        if peer.project.data is not None and peer.project.data.heldout and \
                peer.peer_id in evaluators(trainers, settled.epoch, peer.project.evaluate_every):
            peer.chore(score_heldout(peer.task, peer.optimizer, peer.client.send, settled),
                       f"scoring the held-out set at epoch {settled.epoch}")
        max_epochs = peer.options.max_epochs
        if max_epochs is not None and settled.epoch >= max_epochs:
            peer.stop(f"reached epoch {settled.epoch}")

    async def _upload_checkpoint(self) -> None:
        index, payload = await self.peer.optimizer.snapshot()
        epoch = index.meta.epoch
        if not await self.settled_on(epoch, index.meta.state_sha256):
            log.info("not uploading the checkpoint of epoch %d: the collaboration did not settle on "
                     "our state of it", epoch)
            return
        data = encode_file(index, payload)
        try:
            await self.peer.client.upload_checkpoint(epoch, data, index.meta.state_sha256)
            log.info("uploaded the checkpoint of epoch %d (%.1f MB)", epoch, len(data) / 1e6)
        except BackboneError as exc:
            log.warning("checkpoint upload failed: %s", exc)

    async def settled_on(self, epoch: int, state_sha256: str) -> bool:
        """Whether the collaboration settled on ``state_sha256`` at ``epoch``, once it settled
        that epoch at all (within SETTLE_PATIENCE). Uploaded before, the backbone had no
        state of that epoch to check it against and counted the chore a failure."""
        deadline = time.monotonic() + SETTLE_PATIENCE
        while self._settled is None or self._settled.epoch < epoch:
            self._step_heard.clear()
            if not await finished_within(self._step_heard.wait(), deadline - time.monotonic()):
                return False
        return any(c.step.epoch == epoch and c.step.state_sha256 == state_sha256
                   for c in reversed(self.peer.history[-100:]))

    def on_frame(self, sender: str, frame: Frame) -> None:
        """Frames of rounds wait in the mailbox for their round; state frames go to state_sync."""
        header = frame.header
        if isinstance(header, (StateRequest, StateReply, StateUnavailable)):
            task = self.peer.state_sync.on_frame(sender, frame, header)
            if task is not None:
                self.peer.track(task)
        elif isinstance(header, (Part, Result, Shown)) and header.round_id > self._last_round:
            # (a straggler from a finished round is dropped)
            kind: Kind = ("part" if isinstance(header, Part) else "result" if isinstance(header, Result)
                          else "shown")
            self.peer.mailbox.put(round_key(kind, header.round_id, header.index, sender), frame)
        elif isinstance(header, Input) and header.round_id >= self._last_round:
            self.peer.mailbox.put(input_key(header.index, header.position, header.round_id, sender), frame)

    def on_incoming(self, sender: str, incoming: Incoming) -> None:
        self.peer.state_sync.on_incoming(sender, incoming)
