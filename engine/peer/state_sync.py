"""Getting the collaboration's state (a fresh model, a live peer, a checkpoint) and serving
ours to peers that join. Everything is verified against the hash the sender announced."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable

import torch

from engine.peer.client import BackboneError, ControlClient
from engine.peer.events import PeerEvent, Synced, SyncProgress
from engine.training.optimizer import CollaborativeOptimizer
from engine.transport.link import LinkClosed
from engine.transport.mailbox import Mailbox
from engine.transport.mesh import PeerMesh
from engine.wire import ProtocolError
from engine.wire.control import Ready, SyncPlan, SyncRequest
from engine.wire.frames import StateFrame, StateReply, StateRequest, StateUnavailable
from engine.wire.framing import Frame, Incoming
from engine.wire.tensors import decode_file, encode_file
from engine.wire.types import StateSource

log = logging.getLogger(__name__)

STALL_TIMEOUT = 30.0
PLAN_TIMEOUT = 30.0
ATTEMPTS = 8
MAX_SERVES = 2


class SyncError(RuntimeError):
    pass


class StateSync:
    def __init__(self, client: ControlClient, mesh: PeerMesh, mailbox: Mailbox,
                 optimizer: CollaborativeOptimizer, fresh_model: Callable[[], torch.nn.Module],
                 emit: Callable[[PeerEvent], None]) -> None:
        self.client = client
        self.mesh = mesh
        self.mailbox = mailbox
        self.optimizer = optimizer
        self.fresh_model = fresh_model
        self.emit = emit
        self._lock = asyncio.Lock()
        self._plan: asyncio.Future[SyncPlan] | None = None
        self._requests = itertools.count(1)
        self._serving = asyncio.Semaphore(MAX_SERVES)
        self._activity = 0.0
        self._last_donor: str | None = None

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def plan_arrived(self, plan: SyncPlan) -> None:
        if self._plan is not None and not self._plan.done():
            self._plan.set_result(plan)

    async def resync(self) -> bool:
        """Drop our stale state and fetch the current one (unless a sync is under way)."""
        if self._lock.locked():
            return True
        self.optimizer.unsync()
        return await self.sync()

    async def sync(self) -> bool:
        """Obtain the state and tell the backbone we are ready; False if every attempt failed."""
        async with self._lock:
            exclude: list[str] = []
            for attempt in range(ATTEMPTS):
                try:
                    plan = await self._ask(exclude)
                    digest = await self._fetch(plan)
                except (SyncError, LinkClosed, ProtocolError, BackboneError, asyncio.TimeoutError) as exc:
                    log.warning("getting the state failed: %s", exc)
                    if self._last_donor:
                        exclude.append(self._last_donor)
                        await self.mesh.drop(self._last_donor)  # renegotiated if asked again
                    await asyncio.sleep(min(0.25 * 2 ** attempt, 5.0))
                    continue
                opt = self.optimizer
                await opt.mark_synced()
                self.emit(Synced(opt.epoch, plan.source, digest))
                await self.client.send(Ready(opt.epoch, digest))
                await opt.report_progress(force=True)
                return True
            return False

    async def _ask(self, exclude: list[str]) -> SyncPlan:
        self._last_donor = None
        self._plan = asyncio.get_running_loop().create_future()
        await self.client.send(SyncRequest(list(exclude)))
        return await asyncio.wait_for(self._plan, PLAN_TIMEOUT)

    async def _fetch(self, plan: SyncPlan) -> str:
        opt = self.optimizer
        if plan.source is StateSource.INIT:
            digest = await opt.reset(self.fresh_model())
        elif plan.source is StateSource.CHECKPOINT:
            assert plan.checkpoint is not None
            self.emit(SyncProgress("checkpoint", 0, plan.checkpoint.size))
            data = await self.client.download_checkpoint(
                plan.checkpoint, lambda got, size: self.emit(SyncProgress("checkpoint", got, size)))
            digest = await opt.load(await asyncio.to_thread(decode_file, data))
        else:
            assert plan.peer is not None
            self._last_donor = plan.peer
            digest = await self._from_peer(plan.peer)
        if plan.params_sha256 and digest != plan.params_sha256:
            raise SyncError("downloaded state does not match the collaboration's hash")
        return digest

    async def _from_peer(self, donor: str) -> str:
        request_id = next(self._requests)
        link = await self.mesh.link(donor)
        await link.send(StateRequest(request_id=request_id))
        source = f"peer {donor[:8]}"
        self.emit(SyncProgress(source, 0, 0))
        self._activity = time.monotonic()
        while True:
            try:
                frame = await self.mailbox.get(("state", request_id, donor), timeout=5.0)
                break
            except asyncio.TimeoutError:
                if time.monotonic() - self._activity > STALL_TIMEOUT:
                    raise SyncError(f"state download from {donor} stalled") from None
        reply = frame.header
        if isinstance(reply, StateUnavailable):
            raise SyncError(f"{donor} cannot serve state: {reply.reason}")
        if not isinstance(reply, StateReply):
            raise SyncError(f"{donor} answered a state request with {type(reply).__name__}")
        self.emit(SyncProgress(source, len(frame.payload), len(frame.payload)))
        digest = await self.optimizer.load(await asyncio.to_thread(decode_file, frame.payload))
        if digest != reply.params_sha256:
            raise SyncError("state from peer does not match its announced hash")
        return digest

    # --- serving --------------------------------------------------------------------------

    def on_frame(self, sender: str, frame: Frame, header: StateFrame) -> asyncio.Task | None:
        """Handle state frames; returns the task serving a request, if one was started."""
        if isinstance(header, StateRequest):
            return asyncio.ensure_future(self._serve(sender, header.request_id))
        self.mailbox.put(("state", header.request_id, sender), frame)
        return None

    def on_incoming(self, sender: str, incoming: Incoming) -> None:
        if isinstance(incoming.header, StateReply):
            self._activity = time.monotonic()
            self.emit(SyncProgress(f"peer {sender[:8]}", incoming.received, incoming.expected))

    async def _serve(self, peer: str, request_id: int) -> None:
        opt = self.optimizer
        try:
            if not opt.synced or opt.paused or self._serving.locked():
                reason = "not in sync" if not opt.synced else "paused" if opt.paused else "busy"
                refusal = StateUnavailable(request_id=request_id, reason=reason)
                await (await self.mesh.link(peer)).send(refusal)
                return
            async with self._serving:
                index, payload = await opt.snapshot()
                data = await asyncio.to_thread(encode_file, index, payload)
                meta = index.meta
                header = StateReply(request_id=request_id, epoch=meta.epoch, params_sha256=meta.params_sha256)
                await (await self.mesh.link(peer)).send(header, data)
                log.info("served state of epoch %d to %s (%.1f MB)", meta.epoch, peer, len(data) / 1e6)
        except (LinkClosed, asyncio.TimeoutError) as exc:
            log.info("could not serve state to %s: %s", peer, exc)
