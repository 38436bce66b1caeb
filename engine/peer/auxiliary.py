"""An auxiliary peer (``cotrain peer --aux``): a machine with bandwidth but no useful compute.

It holds no model state and computes no gradient. It joins rounds as a reducer only: the
trainers send it the parts of its share, it combines them as any reducer does (the checks,
mean or CenteredClip) and sends each trainer the result. DeDLOC's LP gives it a share by its
link, as a reducer that brings no gradient of its own, so a fast auxiliary peer takes most
of the traffic off slow home uplinks. It is credited with the bytes it aggregated, shown
apart from computed samples on the leaderboard.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Coroutine
from typing import Any

import torch

from engine.averaging.allreduce import aggregate_parts, round_key
from engine.averaging.errors import AveragingError
from engine.averaging.grouped import grouped_aggregate
from engine.averaging.powersgd import Layout
from engine.averaging.powersgd_round import aggregate_phases
from engine.averaging.round_plan import RoundChanges, RoundPlan
from engine.peer.backbone_loop import ControlLoop
from engine.peer.events import Aggregated, Joined, RoundFailed, StatusChanged
from engine.peer.links import all_links_relayed, keep_measured, offered_addresses, reported_link
from engine.peer.runner import Peer
from engine.peer.training_loop import HEARTBEAT
from engine.tasks import create_task
from engine.training.params import trainable
from engine.transport.backends import restrict_host_addresses
from engine.transport.ice import ice_configuration
from engine.transport.mesh import PeerMesh
from engine.wire.control import (
    AUXILIARY_DEADLINE,
    Audit,
    Availability,
    BackboneMessage,
    IceServers,
    Partners,
    Progress,
    Reassign,
    RoundDone,
    RoundStart,
    Signal,
    Status,
    Step,
)
from engine.wire.frames import Part, Result
from engine.wire.framing import Frame, Incoming
from engine.wire.types import IcePolicy, PeerRole

log = logging.getLogger(__name__)
FRAME_SLACK = 1 << 20  # a part's header and chunk framing, beyond its values


def parameter_shapes(task_name: str, params: dict) -> list[tuple[int, ...]]:
    """The trainable parameters' shapes, in the order their gradients are flattened, from a
    model built on PyTorch's meta device (shapes only, no memory): the averaged vector's
    length, and PowerSGD's layout of it (engine/averaging/powersgd.py)."""
    task = create_task(task_name, params)
    with torch.device("meta"):
        model = task.build_model()
    return [tuple(p.shape) for p in trainable(model)]


class AuxiliaryPeer(Peer):
    """A Peer that only reduces: the control loop, the link probe and rounds; no training
    loop, no state."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.control = AuxiliaryControl(self)
        self.numel = 0
        self.layout: Layout | None = None  # in a PowerSGD project: the two phases' vectors
        self._changes: dict[int, RoundChanges] = {}  # members lost midway, by round (Reassign)
        self._started = 0  # the last round we began
        self._finished = 0  # the last round we are done with: its frames are stale
        self.aggregated_bytes = 0  # this session's, as the rounds went

    @property
    def joined(self) -> bool:
        return self.numel > 0

    def _loops(self) -> list[Coroutine[Any, Any, Any]]:
        self.spawn(keep_measured(self.bandwidth, self.client, self.stopping_event))
        return [self.control.run(), self._heartbeat(), self.stopping_event.wait()]

    async def _start(self) -> None:
        restrict_host_addresses(offered_addresses(self.options))
        reply = await self.client.join(PeerRole.AUXILIARY)
        self.peer_id = reply.peer_id
        project = reply.project
        shapes = await asyncio.to_thread(parameter_shapes, project.task, dict(project.task_params))
        self.numel = sum(math.prod(shape) for shape in shapes)
        if project.compression == "powersgd":
            self.layout = Layout.of(shapes, project.powersgd.rank)
        log.info("joined %s as %s, an auxiliary peer (vectors of %d values)", project.id, self.peer_id,
                 self.numel)
        self.emit(Joined(self.peer_id, project, reply.username))
        # The largest honest frame is a whole vector's part: the project's single reducer.
        max_frame = 4 * self.numel + FRAME_SLACK
        self.mailbox.max_bytes, self.mailbox.max_total = 2 * max_frame, 4 * max_frame
        self.relay_only = self.options.relay_only or reply.ice_policy is IcePolicy.RELAY
        ice = ice_configuration(reply.ice_servers, self.relay_only)
        self._mesh = PeerMesh(self.peer_id, self.control.signal, ice, self.mailbox, self._on_frame,
                              self._on_incoming, max_payload=max_frame, upload=self.upload)
        self.client.upload, self.client.download = self.upload, self.download
        self.apply_limits(self.options.limits)

    def set_running(self, run: bool, reason: str) -> None:
        """Its owner needs the link back (or lets it help again): out of rounds meanwhile."""
        changed = run != self.running
        super().set_running(run, reason)
        if changed and self.joined:
            self.spawn(self.client.send(Availability(paused=not run)))

    async def _heartbeat(self) -> None:
        """Tell the backbone it is alive and what its link achieves: rounds give it a
        share by that."""
        while True:
            if self.joined:
                upload, download = reported_link(self.bandwidth, self.upload, self.download)
                await self.client.send(Progress(epoch=self.collab_epoch, samples=0, samples_per_second=0.0,
                                                client_mode=self.relay_only or all_links_relayed(self.mesh),
                                                upload=upload, download=download))
            await asyncio.sleep(HEARTBEAT / 2)

    # --- rounds -------------------------------------------------------------------------

    def round_started(self, start: RoundStart) -> None:
        mine = self.peer_id in start.group and self.peer_id in start.auxiliary
        if mine and start.round_id > self._started:
            self._started = start.round_id
            self.spawn(self._reduce(start))

    async def _reduce(self, start: RoundStart) -> None:
        project = self.project
        changes = self._changes.setdefault(start.round_id, RoundChanges())
        began = time.monotonic()
        try:
            plan = RoundPlan.of(start, self.peer_id, project.aggregation, project.target_batch_size,
                                project.compression, changes)
            # Giving up before the trainers do, it names whose parts it missed before they
            # name it as the reducer they waited for.
            deadline = AUXILIARY_DEADLINE * start.timeout
            # (a round too large to run flat runs in groups)
            aggregate = aggregate_parts if plan.groups is None else grouped_aggregate
            if plan.phases > 1:
                assert self.layout is not None
                done = await aggregate_phases(plan, self.layout, self.mesh, deadline, aggregate)
            else:
                done = await aggregate(plan, self.numel, self.mesh, deadline)
        except AveragingError as exc:
            log.warning("round %d: %s", start.round_id, exc)
            self.emit(RoundFailed(start.epoch, str(exc)))
            for suspect in exc.suspects:
                self.spawn(self.mesh.drop(suspect))
            await self.client.send(RoundDone(start.round_id, start.epoch, ok=False, error=str(exc)[:4000],
                                             unreachable=exc.suspects))
            return
        finally:
            self._finished = max(self._finished, start.round_id)
            self._changes = {r: c for r, c in self._changes.items() if r > self._finished}
            self.mailbox.discard(lambda key: key[1] > self._finished)
        seconds = time.monotonic() - began
        self.audits.keep(done.reduced)
        self.aggregated_bytes += done.bytes_in
        outcome = RoundDone(start.round_id, start.epoch, ok=True, seconds=seconds, numel=self.numel,
                            phase_numel=done.phase_numel, received=done.received, commitment=done.commitment)
        await self.client.send(outcome)
        self.emit(Aggregated(round_id=start.round_id, epoch=start.epoch, parts=len(done.results),
                             senders=len(done.received), bytes_in=done.bytes_in, seconds=seconds))

    def reassign(self, msg: Reassign) -> None:
        if msg.round_id > self._finished:
            self._changes.setdefault(msg.round_id, RoundChanges()).update(msg.lost, msg.reducers)

    def _on_frame(self, sender: str, frame: Frame) -> None:
        """Parts wait in the mailbox for their round; an auxiliary peer takes nothing else
        (it serves no state and applies no result)."""
        header = frame.header
        if isinstance(header, Part) and header.round_id > self._finished:
            self.mailbox.put(round_key("part", header.round_id, header.index, sender), frame)
        elif not isinstance(header, Result):
            log.debug("ignoring a %s frame from %s", type(header).__name__, sender)

    def _on_incoming(self, sender: str, incoming: Incoming) -> None:
        """Frames under way: nothing to show progress of (parts are small)."""


class AuxiliaryControl(ControlLoop):
    """The backbone's messages, as an auxiliary peer takes them."""

    peer: AuxiliaryPeer

    def __init__(self, peer: AuxiliaryPeer) -> None:
        super().__init__(peer)

    async def _announce(self) -> None:
        """After a reconnect: its link, at once (it has no state to announce)."""
        if not self.peer.running:
            await self.peer.client.send(Availability(paused=True))

    def dispatch(self, msg: BackboneMessage) -> None:
        peer = self.peer
        if isinstance(msg, Signal):
            peer.spawn(peer.mesh.handle_signal(msg.peer, msg.data))
        elif isinstance(msg, RoundStart):
            peer.round_started(msg)
        elif isinstance(msg, Partners):
            peer.mesh.warm(msg.peers)
        elif isinstance(msg, Reassign):
            peer.reassign(msg)
        elif isinstance(msg, Audit):
            if msg.reducer == peer.peer_id:  # (it is never asked to check: it holds no state)
                peer.audits.on_audit(msg)
        elif isinstance(msg, Step):
            peer.collab_epoch = msg.epoch
            peer.audits.settled(msg.round_id)
            last = peer.options.max_epochs
            if last is not None and msg.epoch >= last:
                peer.stop(f"reached epoch {msg.epoch}")
        elif isinstance(msg, Status):
            peer.status = msg
            peer.collab_epoch = msg.epoch
            peer.emit(StatusChanged(msg, peer.traffic()))
        elif isinstance(msg, IceServers):
            peer.mesh.config = ice_configuration(msg.servers, peer.relay_only)
