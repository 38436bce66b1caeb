"""A peer's control loop: messages from the backbone, and reconnecting when it goes away."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from engine.peer.checking import Audits
from engine.peer.client import PROJECT_CHANGED, BackboneError, ControlClient
from engine.peer.events import Connection, PeerEvent, StatusChanged
from engine.peer.options import PeerOptions
from engine.peer.progress import ProgressReporter
from engine.peer.round_pipeline import RoundPipeline
from engine.peer.rounds import Rounds
from engine.peer.state_sync import StateSync
from engine.problems import retrying, where
from engine.training.optimizer import CollaborativeOptimizer
from engine.transport.counters import LinkCounters
from engine.transport.ice import ice_configuration
from engine.transport.mesh import PeerMesh
from engine.wire.control import (
    Audit,
    Availability,
    BackboneMessage,
    IceServers,
    Partners,
    Reassign,
    Resync,
    RoundStart,
    Signal,
    SignalData,
    Status,
    Step,
    SyncPlan,
)

log = logging.getLogger(__name__)


class ControlledPeer(Protocol):
    """What the backbone's messages reach in a peer."""

    peer_id: str
    options: PeerOptions
    client: ControlClient
    rounds: Rounds
    audits: Audits
    relay_only: bool
    collab_epoch: int
    status: Status | None
    emit: Callable[[PeerEvent], None]
    spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task]

    @property
    def running(self) -> bool: ...

    @property
    def stopping_event(self) -> asyncio.Event: ...

    @property
    def mesh(self) -> PeerMesh: ...

    @property
    def optimizer(self) -> CollaborativeOptimizer: ...

    @property
    def progress(self) -> ProgressReporter: ...

    @property
    def pipeline(self) -> RoundPipeline: ...

    @property
    def state_sync(self) -> StateSync: ...

    def stop(self, reason: str = "stopped") -> None: ...

    def traffic(self) -> LinkCounters: ...

    def check_behind(self) -> None: ...

    def resync_later(self, epoch: int, state_sha256: str | None) -> None: ...

    async def resync(self, epoch: int | None = None, state_sha256: str | None = None) -> None: ...


class ControlLoop:
    def __init__(self, peer: ControlledPeer) -> None:
        self.peer = peer

    async def signal(self, other: str, data: SignalData) -> None:
        await self.peer.client.send(Signal(other, data))

    async def run(self) -> None:
        peer, client = self.peer, self.peer.client
        while True:
            async for msg in client.messages():
                self.dispatch(msg)
            if peer.stopping_event.is_set():
                return
            reason = client.close_reason
            log.warning("lost the backbone (%s); reconnecting", reason)
            peer.progress.lost_backbone()
            peer.emit(Connection(False, f"Lost the backbone at {where(client.base_url)}: reconnecting."))

            def waiting(delay: float, why: str) -> None:
                peer.emit(Connection(False, retrying(why, delay)))

            try:
                await client.reconnect(peer.stopping_event, peer.options.reconnect_for, waiting)
            except BackboneError as exc:
                peer.stop(PROJECT_CHANGED if exc.rejoin else f"lost the backbone: {exc}")
                return
            peer.emit(Connection(True, "reconnected to the backbone"))
            await self._announce()

    async def _announce(self) -> None:
        """After a reconnect: the backbone may have restarted. Tell it where we are, keep what
        we accumulated, and how our last step went, in case it died before recording it."""
        peer, client = self.peer, self.peer.client
        opt = peer.optimizer
        if not peer.running:
            await client.send(Availability(paused=True))
        if opt.synced and not peer.state_sync.busy:
            last = peer.pipeline.last_step
            if last is not None and last.epoch + 1 == opt.epoch:
                await client.send(last)
            await peer.state_sync.say_ready()
            await peer.progress.report(force=True)
        elif not peer.state_sync.busy:
            peer.spawn(peer.resync())

    def dispatch(self, msg: BackboneMessage) -> None:
        peer = self.peer
        if isinstance(msg, Signal):
            peer.spawn(peer.mesh.handle_signal(msg.peer, msg.data))
        elif isinstance(msg, SyncPlan):
            peer.collab_epoch = msg.epoch
            peer.state_sync.plan_arrived(msg)
        elif isinstance(msg, RoundStart):
            peer.spawn(peer.rounds.run(msg))
        elif isinstance(msg, Partners):
            peer.mesh.warm(msg.peers)
        elif isinstance(msg, Reassign):
            peer.rounds.reassign(msg)
        elif isinstance(msg, Step):
            peer.collab_epoch = msg.epoch
            peer.optimizer.settled(msg.epoch, msg.state_sha256)
            peer.progress.settled(msg.epoch)
            peer.rounds.settled(msg)
            peer.audits.settled(msg.round_id)
            peer.state_sync.note_settled(msg.epoch, msg.state_sha256)
            peer.check_behind()
        elif isinstance(msg, Audit):
            peer.audits.on_audit(msg)
        elif isinstance(msg, Resync):
            peer.collab_epoch = msg.epoch
            held = (peer.optimizer.epoch, peer.optimizer.hash.value)
            # A step of ours the collaboration did not keep is worth a user's notice; catching up is not.
            undone = held != (msg.epoch, msg.state_sha256) and held[0] >= msg.epoch
            (log.warning if undone else log.info)("resync to epoch %d requested: %s", msg.epoch, msg.reason)
            if held != (msg.epoch, msg.state_sha256):
                peer.rounds.undone()
            peer.resync_later(msg.epoch, msg.state_sha256)
        elif isinstance(msg, Status):
            peer.status = msg
            peer.progress.observe(msg)
            peer.spawn(peer.progress.tell_if_near())
            peer.collab_epoch = msg.epoch
            peer.emit(StatusChanged(msg, peer.traffic()))
        elif isinstance(msg, IceServers):
            peer.mesh.config = ice_configuration(msg.servers, peer.relay_only)
