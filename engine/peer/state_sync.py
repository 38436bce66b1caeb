"""Getting the collaboration's state (a fresh model, a live peer, a checkpoint) and serving
ours to peers that join.

A state from elsewhere is checked before it is used: its hash, computed from its bytes,
must be the one the collaboration settled on for its epoch (the backbone says it with the
plan and in every Step; a donor may serve a later epoch than planned), and its
tensors must fit this project's model and optimizer, be finite and no larger than they
can be. One that fails costs the donor (the backbone is told) and the joiner asks another.
State never lands under a round of ours still under way."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable

import torch

from engine.backoff import Backoff
from engine.peer.client import BackboneError, ControlClient
from engine.peer.events import PeerEvent, Synced, SyncProgress
from engine.peer.progress import ProgressReporter
from engine.training.optimizer import CollaborativeOptimizer
from engine.training.state import check_state, warm_slots
from engine.transport.link import MIN_RECEIVE_LIMIT, LinkClosed
from engine.transport.mailbox import Key, Mailbox
from engine.transport.mesh import PeerMesh
from engine.wire import ProtocolError
from engine.wire.control import BadState, Ready, SyncPlan, SyncRequest
from engine.wire.frames import StateFrame, StateReply, StateRequest, StateUnavailable
from engine.wire.framing import Frame, Incoming
from engine.wire.tensors import StateFile, decode_file, encode_file
from engine.wire.types import StateSource

log = logging.getLogger(__name__)

STALL_TIMEOUT = 30.0
PLAN_TIMEOUT = 30.0
ATTEMPTS = 8
MAX_SERVES = 2
SETTLED_KEPT = 64  # epochs of settled hashes remembered, for donors that serve a later one
SERVE_GRACE = 60.0


class SyncError(RuntimeError):
    pass


class BadDonorState(SyncError):
    """What a donor served is not the collaboration's state."""


class StateSync:
    def __init__(self, client: ControlClient, mesh: PeerMesh, mailbox: Mailbox,
                 optimizer: CollaborativeOptimizer, progress: ProgressReporter,
                 fresh_model: Callable[[], torch.nn.Module], emit: Callable[[PeerEvent], None]) -> None:
        self.client = client
        self.mesh = mesh
        self.mailbox = mailbox
        self.optimizer = optimizer
        self.progress = progress
        self.fresh_model = fresh_model
        self.emit = emit
        self._lock = asyncio.Lock()
        self._plan: asyncio.Future[SyncPlan] | None = None
        self._requests = itertools.count(1)
        self._asked: tuple[int, str] | None = None  # the request under way, and its donor
        self._serving = asyncio.Semaphore(MAX_SERVES)
        self._serving_to: set[str] = set()  # one state at a time per peer
        self._settled: dict[int, str] = {}  # epoch -> the hash the collaboration settled on (recent)
        self._activity = 0.0
        self._last_donor: str | None = None

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def plan_arrived(self, plan: SyncPlan) -> None:
        if plan.state_sha256:
            self.note_settled(plan.epoch, plan.state_sha256)
        if self._plan is not None and not self._plan.done():
            self._plan.set_result(plan)

    def note_settled(self, epoch: int, state_sha256: str) -> None:
        """The collaboration settled on this state (a Step, a plan): a donor's state of that
        epoch must hash to it."""
        self._settled[epoch] = state_sha256
        for old in [e for e in self._settled if e < epoch - SETTLED_KEPT]:
            del self._settled[old]

    async def resync(self, epoch: int | None = None, state_sha256: str | None = None) -> bool:
        """Drop our stale state and get the settled one (unless a sync is under way): from
        what we kept before a step that did not settle, or else downloaded."""
        if self._lock.locked():
            return True
        async with self._lock:  # (taken at once: nothing ran since the check)
            opt = self.optimizer
            await opt.round_over()
            if opt.synced and (epoch, state_sha256) == (opt.epoch, opt.hash.value):
                # Our step was judged after the round closed, or a message crossed: we hold it.
                opt.settled(opt.epoch, opt.hash.value)
                await self.say_ready()
                return True
            if epoch is not None and state_sha256 is not None and await opt.restore(epoch, state_sha256):
                log.info("back to the settled state of epoch %d, kept from before the last step", epoch)
                self.emit(Synced(opt.epoch, "kept", state_sha256))
                await self.say_ready()
                return True
            opt.unsync()
            return await self._download()

    async def carry_on(self, data: bytes) -> bool:
        """Start from the state this computer's previous peer held as the project changed
        under it (its model did not: engine/backbone/project_watch.py), with no download;
        the backbone then settles whether it is the collaboration's. False if it does not fit."""
        def fitting() -> StateFile:  # (its hash is checked by the backbone's settlement)
            state = decode_file(data)
            self._fit(state)
            return state

        async with self._lock:
            try:
                state = await asyncio.to_thread(fitting)
            except ProtocolError as exc:
                log.warning("not starting from the state held before the project changed: %s", exc)
                return False
            await self._adopted("this computer, before the project changed", await self.optimizer.load(state))
            return True

    async def _adopted(self, source: str, digest: str) -> None:
        """A state is ours: compute on it, and say so."""
        opt = self.optimizer
        await opt.mark_synced()
        self.emit(Synced(opt.epoch, source, digest))
        await self.say_ready()
        await self.progress.report(force=True)

    async def say_ready(self) -> None:
        """Tell the backbone which state we hold and compute on (the one place a Ready is
        sent: after a download, a return to a kept state, a reconnect)."""
        await self.client.send(Ready(self.optimizer.epoch, self.optimizer.hash.value))

    async def sync(self) -> bool:
        """Obtain the state and tell the backbone we are ready; False if every attempt failed."""
        async with self._lock:
            return await self._download()

    async def _download(self) -> bool:
        """Ask for a source and fetch from it until one serves the settled state (the lock held)."""
        exclude: list[str] = []
        backoff = Backoff(0.5, 5.0)
        for _ in range(ATTEMPTS):
            try:
                plan = await self._ask(exclude)
                await self.optimizer.round_over()
                digest = await self._fetch(plan)
            except (SyncError, LinkClosed, ProtocolError, BackboneError, asyncio.TimeoutError) as exc:
                log.warning("getting the state from %s failed: %s", self._last_donor or "the backbone",
                            str(exc) or type(exc).__name__)
                if self._last_donor:
                    if isinstance(exc, BadDonorState):
                        await self.client.send(BadState(self._last_donor, str(exc)[:1000]))
                    exclude.append(self._last_donor)
                    await self.mesh.drop(self._last_donor)  # renegotiated if asked again
                await asyncio.sleep(backoff.next())
                continue
            await self._adopted(plan.source, digest)
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
            expected = plan.state_sha256 or plan.checkpoint.state_sha256
            state = await asyncio.to_thread(self._checked, data, expected)
            digest = await opt.load(state)
        else:
            assert plan.peer is not None
            self._last_donor = plan.peer
            return await self._from_peer(plan.peer, known=plan.state_sha256 is not None)
        if plan.state_sha256 and digest != plan.state_sha256:
            raise SyncError("the state does not match the collaboration's hash")
        return digest

    def _checked(self, data: bytes | bytearray, expected: str) -> StateFile:
        """The state file, if it is the one expected and fits this project (else BadDonorState)."""
        try:
            state = decode_file(data)
            if state.state_sha256() != expected:
                raise ProtocolError("its hash is not the collaboration's")
            self._fit(state)
        except ProtocolError as exc:
            raise BadDonorState(f"refused the state: {exc}") from None
        return state

    def _fit(self, state: StateFile) -> None:
        """ProtocolError unless ``state`` is one of this project's model and optimizer."""
        opt = self.optimizer
        check_state(state, opt.model, opt.optimizer, opt.project_id,
                    warm_slots(opt.optimizer, opt.params, opt.warm_shapes))

    async def _from_peer(self, donor: str, known: bool) -> str:
        """The donor's state, checked against the settled hash of its epoch -- or, when the
        backbone knows none yet (just upgraded from parameter hashes), against its own claim."""
        request_id = next(self._requests)
        link = await self.mesh.link(donor)
        self._asked = (request_id, donor)
        try:
            await link.send(StateRequest(request_id=request_id))
            source = f"peer {donor[:8]}"
            self.emit(SyncProgress(source, 0, 0))
            self._activity = time.monotonic()
            while True:
                try:
                    frame = await self.mailbox.get(Key("state", request_id, (), donor), timeout=5.0)
                    break
                except asyncio.TimeoutError:
                    if time.monotonic() - self._activity > STALL_TIMEOUT:
                        raise SyncError(f"state download from {donor} stalled") from None
        finally:
            self._asked = None
        reply = frame.header
        if isinstance(reply, StateUnavailable):
            raise SyncError(f"{donor} cannot serve state: {reply.reason}")
        if not isinstance(reply, StateReply):
            raise SyncError(f"{donor} answered a state request with {type(reply).__name__}")
        self.emit(SyncProgress(source, len(frame.payload), len(frame.payload)))
        expected = self._settled.get(reply.epoch) if known else reply.state_sha256
        if expected is None:
            # Rounds went on while it was sent, or the donor lags: not a lie we can prove.
            raise SyncError(f"{donor} served epoch {reply.epoch}, whose settled state we do not know")
        state = await asyncio.to_thread(self._checked, frame.payload, expected)
        return await self.optimizer.load(state)

    # --- serving --------------------------------------------------------------------------

    def on_frame(self, sender: str, frame: Frame, header: StateFrame) -> asyncio.Task | None:
        """Handle state frames; returns the task serving a request, if one was started."""
        if isinstance(header, StateRequest):
            return asyncio.ensure_future(self._serve(sender, header.request_id))
        if self._asked == (header.request_id, sender):
            self.mailbox.put(Key("state", header.request_id, (), sender), frame)
        # else: an answer we no longer wait for (or never asked for) holds no memory here
        return None

    def on_incoming(self, sender: str, incoming: Incoming) -> None:
        if isinstance(incoming.header, StateReply):
            self._activity = time.monotonic()
            self.emit(SyncProgress(f"peer {sender[:8]}", incoming.received, incoming.expected))

    async def _serve(self, peer: str, request_id: int) -> None:
        """Send ``peer`` our state. A peer that reads it slowly holds one of our serving slots
        at most as long as the slowest rate a peer may ask of us would take."""
        opt = self.optimizer
        try:
            if not opt.synced or opt.paused or self._serving.locked() or peer in self._serving_to:
                reason = "not in sync" if not opt.synced else "paused" if opt.paused else "busy"
                refusal = StateUnavailable(request_id=request_id, reason=reason)
                await (await self.mesh.link(peer)).send(refusal)
                return
            self._serving_to.add(peer)
            try:
                async with self._serving:
                    index, payload = await opt.snapshot()
                    data = await asyncio.to_thread(encode_file, index, payload)
                    meta = index.meta
                    header = StateReply(request_id=request_id, epoch=meta.epoch,
                                        state_sha256=meta.state_sha256)
                    link = await self.mesh.link(peer)
                    limit = SERVE_GRACE + len(data) / MIN_RECEIVE_LIMIT
                    await asyncio.wait_for(link.send(header, data), limit)
                    log.info("served state of epoch %d to %s (%.1f MB)", meta.epoch, peer,
                             len(data) / 1e6)
            finally:
                self._serving_to.discard(peer)
        except (LinkClosed, asyncio.TimeoutError) as exc:
            log.info("could not serve state to %s: %s", peer, exc or "too slow")
            if isinstance(exc, asyncio.TimeoutError):
                await self.mesh.drop(peer)
