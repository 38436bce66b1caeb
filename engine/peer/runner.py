"""One peer of a collaboration, from joining to leaving.

Three concurrent activities share one event loop: the control loop (messages from the
backbone), the training loop (micro-batches on the compute thread), and rounds (opened by
the backbone, averaged over the mesh). State downloads happen whenever the peer is behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlparse

import torch

from engine.averaging.allreduce import Averaged, RoundPlan, butterfly_allreduce
from engine.peer.client import BackboneClient, BackboneError
from engine.peer.events import (
    EpochCompleted,
    Event,
    Joined,
    RoundFailed,
    StatusChanged,
    Stopped,
    Synced,
    SyncProgress,
)
from engine.tasks import Task, create_task, initial_model
from engine.training.optimizer import CollaborativeOptimizer, EpochResult
from engine.training.schedule import build_optimizer
from engine.transport.ice import ice_configuration, is_loopback_host, restrict_host_addresses
from engine.transport.link import LinkClosed
from engine.transport.mailbox import Mailbox
from engine.transport.mesh import PeerMesh
from engine.wire import ProtocolError
from engine.wire.framing import Frame, Incoming
from engine.wire.messages import (
    DATA_TYPES,
    EpochAdvanced,
    Error,
    Ready,
    Resync,
    RoundStart,
    Signal,
    StateReply,
    StateRequest,
    StateUnavailable,
    Status,
    SyncPlan,
    SyncRequest,
    from_wire,
    to_wire,
)
from engine.wire.tensors import decode_file, encode_file

log = logging.getLogger(__name__)

STATE_STALL_TIMEOUT = 30.0
SYNC_ATTEMPTS = 8
MAX_STATE_SERVES = 2
CHECKPOINT_UPLOAD_TIMEOUT = 120.0


class SyncError(RuntimeError):
    pass


@dataclass
class PeerOptions:
    backbone_url: str
    project_id: str
    name: str = ""
    max_epochs: int | None = None
    threads: int | None = None
    data_dir: str | None = None
    data_seed: int | None = None
    slowdown: float = 1.0
    ice_addresses: list[str] | None = None
    user_token: str | None = None


class Peer:
    def __init__(self, options: PeerOptions, on_event: Callable[[Event], None] | None = None) -> None:
        self.options = options
        self.history: list[EpochResult] = []
        self.status: Status | None = None
        self.peer_id = ""
        self._emit = on_event or (lambda event: None)
        self._client = BackboneClient(options.backbone_url, options.project_id,
                                      options.name or f"peer-{os.getpid()}", options.user_token)
        self._stop = asyncio.Event()
        self._stop_reason = ""
        self._tasks: set[asyncio.Task] = set()
        self._sync_lock = asyncio.Lock()
        self._sync_reply: asyncio.Future[SyncPlan] | None = None
        self._collab_epoch = 0
        self._requests = itertools.count(1)
        self._serving = asyncio.Semaphore(MAX_STATE_SERVES)
        self._state_activity = 0.0
        self._uploads: set[asyncio.Task] = set()
        self._mailbox = Mailbox()
        self._mesh: PeerMesh | None = None
        self._opt: CollaborativeOptimizer | None = None
        self._task: Task | None = None

    @property
    def optimizer(self) -> CollaborativeOptimizer:
        assert self._opt is not None
        return self._opt

    @property
    def mesh(self) -> PeerMesh:
        assert self._mesh is not None
        return self._mesh

    def stop(self, reason: str = "stopped") -> None:
        self._stop_reason = self._stop_reason or reason
        self._stop.set()

    async def run(self) -> str:
        """Train until ``max_epochs``, ``stop()`` or the backbone goes away; returns why it ended."""
        loops: list[asyncio.Task] = []
        try:
            await self._start()
            control = asyncio.ensure_future(self._control_loop())
            training = asyncio.ensure_future(self._training_loop())
            stopping = asyncio.ensure_future(self._stop.wait())
            loops = [control, training, stopping]
            self._spawn(self._sync())
            done, _ = await asyncio.wait(loops, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if not task.cancelled() and task.exception():
                    raise task.exception()  # type: ignore[misc]
            if control in done:
                self.stop(f"lost the backbone ({self._client.close_reason})")
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await self._shutdown()
        self._emit(Stopped(self._stop_reason))
        return self._stop_reason

    async def _start(self) -> None:
        opts = self.options
        if opts.threads:
            torch.set_num_threads(opts.threads)
        addresses = opts.ice_addresses
        if addresses is None and is_loopback_host(urlparse(opts.backbone_url).hostname or ""):
            addresses = ["127.0.0.1"]
        restrict_host_addresses(addresses)
        reply = await self._client.join()
        self.peer_id = reply.peer_id
        project = reply.project
        log.info("joined %s as %s", project.id, self.peer_id)
        self._emit(Joined(self.peer_id, project))
        self._task = await asyncio.to_thread(create_task, project.task, project.task_params,
                                             opts.data_dir)
        model = self._fresh_model()
        optimizer = build_optimizer(project.optimizer, model.parameters())
        self._mesh = PeerMesh(self.peer_id, self._signal, ice_configuration(reply.ice_servers),
                              self._mailbox, self._on_frame, self._on_incoming,
                              max_payload=reply.max_checkpoint_bytes)
        self._opt = CollaborativeOptimizer(
            model, optimizer, project.schedule, project_id=project.id, me=self.peer_id,
            averager=self._average, send=self._client.send,
            clip_grad_norm=project.optimizer.clip_grad_norm,
            report_interval=reply.report_interval, target_batch_size=project.target_batch_size,
        )

    def _fresh_model(self) -> torch.nn.Module:
        assert self._task is not None and self._client.join_reply is not None
        return initial_model(self._task, self._client.join_reply.project.seed)

    async def _shutdown(self) -> None:
        pending = [t for t in self._uploads if not t.done()]
        if pending:
            # The collaboration asked us for this checkpoint; if we are the last peer to
            # leave, it is the state the next one resumes from.
            await asyncio.wait(pending, timeout=CHECKPOINT_UPLOAD_TIMEOUT)
        for task in list(self._tasks):
            task.cancel()
        if self._mesh is not None:
            await self._mesh.close()
        await self._client.close()
        if self._opt is not None:
            self._opt.executor.shutdown(wait=True, cancel_futures=True)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("peer task failed: %r", exc, exc_info=exc)
            self.stop(f"internal error: {exc}")

    # --- control plane ------------------------------------------------------------------

    async def _signal(self, peer: str, data: dict) -> None:
        await self._client.send(Signal(peer, data))

    async def _control_loop(self) -> None:
        async for msg in self._client.messages():
            if isinstance(msg, Signal):
                self._spawn(self.mesh.handle_signal(msg.peer, msg.data))
            elif isinstance(msg, SyncPlan):
                self._collab_epoch = msg.epoch
                if self._sync_reply is not None and not self._sync_reply.done():
                    self._sync_reply.set_result(msg)
            elif isinstance(msg, RoundStart):
                self._spawn(self._round(msg))
            elif isinstance(msg, EpochAdvanced):
                self._collab_epoch = msg.epoch
                self.optimizer.observe_epoch(msg.epoch)
                self._check_behind()
            elif isinstance(msg, Resync):
                log.info("resync requested: %s", msg.reason)
                self._collab_epoch = msg.epoch
                self._spawn(self._resync())
            elif isinstance(msg, Status):
                self.status = msg
                self.optimizer.observe(msg)
                self._collab_epoch = msg.epoch
                self._emit(StatusChanged(msg))
            elif isinstance(msg, Error):
                log.error("backbone: %s", msg.message)
                self.stop(f"backbone refused: {msg.message}")

    def _check_behind(self) -> None:
        opt = self.optimizer
        if opt.synced and not opt.in_round and opt.epoch < self._collab_epoch:
            log.info("behind the collaboration (epoch %d < %d)", opt.epoch, self._collab_epoch)
            self._spawn(self._resync())

    # --- rounds -----------------------------------------------------------------------

    async def _average(self, plan: RoundPlan, vector: torch.Tensor, samples: int, loss_sum: float,
                       timeout: float) -> Averaged:
        return await butterfly_allreduce(plan, vector, samples, loss_sum, self.mesh, timeout)

    async def _round(self, start: RoundStart) -> None:
        result = await self.optimizer.run_round(start)
        self._mailbox.discard(lambda key: key[0] not in ("part", "result") or key[1] > start.round_id)
        if result is None:
            if self.peer_id in start.group:
                self._emit(RoundFailed(start.epoch, "averaging failed"))
            self._check_behind()
            return
        self.history.append(result)
        self._collab_epoch = max(self._collab_epoch, result.epoch)
        self._emit(EpochCompleted(result))
        if start.checkpoint_by == self.peer_id:
            self._uploads.add(self._spawn(self._upload_checkpoint()))
        if self.options.max_epochs is not None and result.epoch >= self.options.max_epochs:
            self.stop(f"reached epoch {result.epoch}")

    async def _upload_checkpoint(self) -> None:
        index, payload = await self.optimizer.snapshot()
        data = encode_file(index, payload)
        try:
            await self._client.upload_checkpoint(index["meta"]["epoch"], data,
                                                 index["meta"]["params_sha256"])
            log.info("uploaded checkpoint of epoch %d (%.1f MB)", index["meta"]["epoch"], len(data) / 1e6)
        except BackboneError as exc:
            log.warning("checkpoint upload failed: %s", exc)

    # --- training -----------------------------------------------------------------------

    async def _training_loop(self) -> None:
        opts, task, opt = self.options, self._task, self.optimizer
        assert task is not None
        seed = opts.data_seed if opts.data_seed is not None else int(self.peer_id[:15], 16)
        model = opt.model
        for index in itertools.count():
            def micro_batch(index: int = index) -> tuple[int, float]:
                batch = task.batch(seed, index)
                loss_sum = task.loss(model, batch) * batch.size
                loss_sum.backward()
                return batch.size, float(loss_sum.detach())

            await opt.compute(micro_batch, index)
            if opts.slowdown > 1.0:
                # A deliberately slow device: idle for (slowdown - 1) x the compute time.
                pause = (opts.slowdown - 1.0) * opt.last_compute_seconds
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), pause)

    # --- state --------------------------------------------------------------------------

    async def _resync(self) -> None:
        if self._sync_lock.locked():
            return
        self.optimizer.unsync()
        await self._sync()

    async def _sync(self) -> None:
        async with self._sync_lock:
            exclude: list[str] = []
            for attempt in range(SYNC_ATTEMPTS):
                plan = await self._ask_sync_plan(exclude)
                try:
                    digest = await self._fetch_state(plan)
                except (SyncError, LinkClosed, ProtocolError, BackboneError, asyncio.TimeoutError) as exc:
                    log.warning("state from %s failed: %s", plan.peer or plan.source, exc)
                    if plan.peer:
                        exclude.append(plan.peer)
                    await asyncio.sleep(min(2.0 ** attempt * 0.25, 5.0))
                    continue
                opt = self.optimizer
                await opt.mark_synced()
                self._emit(Synced(opt.epoch, plan.source, digest))
                await self._client.send(Ready(opt.epoch, digest))
                await opt.report_progress(force=True)
                return
            self.stop("could not obtain the collaboration's state")

    async def _ask_sync_plan(self, exclude: list[str]) -> SyncPlan:
        self._sync_reply = asyncio.get_running_loop().create_future()
        await self._client.send(SyncRequest(exclude))
        return await asyncio.wait_for(self._sync_reply, 30)

    async def _fetch_state(self, plan: SyncPlan) -> str:
        opt = self.optimizer
        if plan.source == "init":
            digest = await opt.reset(self._fresh_model())
        elif plan.source == "checkpoint":
            assert plan.checkpoint is not None
            total = plan.checkpoint.size
            self._emit(SyncProgress("checkpoint", 0, total))
            data = await self._client.download_checkpoint(
                plan.checkpoint, lambda got, size: self._emit(SyncProgress("checkpoint", got, size)))
            digest = await opt.load(await asyncio.to_thread(decode_file, data))
        else:
            assert plan.peer is not None
            digest = await self._state_from_peer(plan.peer)
        if plan.params_sha256 and digest != plan.params_sha256:
            raise SyncError("downloaded state does not match the collaboration's hash")
        return digest

    async def _state_from_peer(self, donor: str) -> str:
        request_id = next(self._requests)
        link = await self.mesh.link(donor)
        await link.send(to_wire(StateRequest(request_id)))
        self._emit(SyncProgress(f"peer {donor[:8]}", 0, 0))
        self._state_activity = time.monotonic()
        while True:
            try:
                frame = await self._mailbox.get(("state", request_id, donor), timeout=5.0)
                break
            except asyncio.TimeoutError:
                if time.monotonic() - self._state_activity > STATE_STALL_TIMEOUT:
                    raise SyncError(f"state download from {donor} stalled") from None
        if frame.type == StateUnavailable.TYPE:
            raise SyncError(f"{donor} cannot serve state: {frame.header.get('reason')}")
        reply = from_wire(frame.header, {StateReply.TYPE: StateReply})
        size = len(frame.payload)
        self._emit(SyncProgress(f"peer {donor[:8]}", size, size))
        bundle = await asyncio.to_thread(decode_file, frame.payload)
        digest = await self.optimizer.load(bundle)
        if digest != reply.params_sha256:
            raise SyncError("state from peer does not match its announced hash")
        return digest

    async def _serve_state(self, peer: str, request_id: int) -> None:
        opt = self.optimizer
        if not opt.synced or self._serving.locked():
            reason = "busy" if opt.synced else "not in sync"
            await (await self.mesh.link(peer)).send(to_wire(StateUnavailable(request_id, reason)))
            return
        async with self._serving:
            index, payload = await opt.snapshot()
            data = await asyncio.to_thread(encode_file, index, payload)
            meta = index["meta"]
            header = to_wire(StateReply(request_id, meta["epoch"], meta["params_sha256"]))
            await (await self.mesh.link(peer)).send(header, data)
            log.info("served state of epoch %d to %s (%.1f MB)", meta["epoch"], peer, len(data) / 1e6)

    # --- data plane ---------------------------------------------------------------------

    def _on_frame(self, sender: str, frame: Frame) -> None:
        kind = frame.type
        if kind not in DATA_TYPES:
            log.warning("ignoring frame of unknown type %r from %s", kind, sender)
            return
        if kind == StateRequest.TYPE:
            try:
                request = from_wire(frame.header, {kind: StateRequest})
            except ProtocolError as exc:
                log.warning("bad state request from %s: %s", sender, exc)
                return
            self._spawn(self._serve_for(sender, request.request_id))
            return
        key_field = "round_id" if kind in ("part", "result") else "request_id"
        ident = frame.header.get(key_field)
        if not isinstance(ident, int) or isinstance(ident, bool):
            log.warning("ignoring %s frame without %s from %s", kind, key_field, sender)
            return
        box = "state" if kind in (StateReply.TYPE, StateUnavailable.TYPE) else kind
        self._mailbox.put((box, ident, sender), frame)

    async def _serve_for(self, sender: str, request_id: int) -> None:
        try:
            await self._serve_state(sender, request_id)
        except (LinkClosed, asyncio.TimeoutError) as exc:
            log.info("could not serve state to %s: %s", sender, exc)

    def _on_incoming(self, sender: str, incoming: Incoming) -> None:
        if incoming.header.get("type") == StateReply.TYPE:
            self._state_activity = time.monotonic()
            self._emit(SyncProgress(f"peer {sender[:8]}", incoming.received, incoming.expected))
