"""One peer of a collaboration, from joining to leaving.

Three activities share one event loop: the control loop (messages from the backbone, and
reconnecting when it goes away), the training loop (micro-batches on the compute thread),
and rounds (opened by the backbone, averaged over the mesh). State downloads happen
whenever the peer is behind (see state_sync.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlparse

import torch

from engine.averaging.allreduce import Averaged, AveragingError, RoundPlan, butterfly_allreduce
from engine.governor.limits import Limits
from engine.governor.throttle import ComputeGate
from engine.peer.client import BackboneClient, BackboneError
from engine.peer.events import (
    ComputingOn,
    Connection,
    EpochCompleted,
    Event,
    Governed,
    Joined,
    RoundFailed,
    StatusChanged,
    Stopped,
)
from engine.peer.state_sync import StateSync
from engine.tasks import Task, create_task, initial_model
from engine.training.device import Placement, choose_device
from engine.training.optimizer import CollaborativeOptimizer, EpochResult
from engine.training.schedule import build_optimizer
from engine.transport.ice import ice_configuration, is_loopback_host, restrict_host_addresses
from engine.transport.link import LinkCounters
from engine.transport.mailbox import Mailbox
from engine.transport.mesh import PeerMesh
from engine.transport.shaping import RateLimiter
from engine.wire.framing import Frame
from engine.wire.messages import (
    DATA_TYPES,
    Availability,
    EpochAdvanced,
    Error,
    IceServers,
    Ready,
    Resync,
    RoundStart,
    Signal,
    StateReply,
    StateRequest,
    StateUnavailable,
    Status,
    SyncPlan,
)
from engine.wire.tensors import encode_file

log = logging.getLogger(__name__)
CHECKPOINT_UPLOAD_TIMEOUT = 120.0
HEARTBEAT = 5.0  # well inside the backbone's peer timeout (15 s by default)


@dataclass
class PeerOptions:
    backbone_url: str
    project_id: str
    name: str = ""
    max_epochs: int | None = None
    threads: int | None = None
    data_dir: str | None = None
    data_seed: int | None = None
    slowdown: float = 1.0  # behave like a device this many times slower (tests, benchmarks)
    ice_addresses: list[str] | None = None
    user_token: str | None = None
    reconnect_for: float = 600.0  # seconds to keep trying when the backbone goes away
    limits: Limits = field(default_factory=Limits)
    relay_only: bool = False  # connect to other peers through TURN only


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
        self._uploads: set[asyncio.Task] = set()
        self._collab_epoch = 0
        self._last_round = 0
        self._mailbox = Mailbox()
        self._mesh: PeerMesh | None = None
        self._opt: CollaborativeOptimizer | None = None
        self._sync: StateSync | None = None
        self._task: Task | None = None
        self._running = True
        self._resync_on_resume = False
        self._placement: Placement | None = None
        self._relay_only = options.relay_only
        self.gate = ComputeGate(options.limits.cpu_percent, options.slowdown)
        self.upload = RateLimiter()
        self.download = RateLimiter()

    @property
    def optimizer(self) -> CollaborativeOptimizer:
        assert self._opt is not None
        return self._opt

    @property
    def mesh(self) -> PeerMesh:
        assert self._mesh is not None
        return self._mesh

    @property
    def state_sync(self) -> StateSync:
        assert self._sync is not None
        return self._sync

    # --- what the governor controls -------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._running

    @property
    def placement(self) -> Placement | None:
        """Where micro-batches run (None before the peer has joined)."""
        return self._placement

    def set_running(self, run: bool, reason: str) -> None:
        """Compute or give the machine back. A paused peer leaves rounds; when it runs again
        and the collaboration has moved on, it catches up by downloading the state."""
        changed = run != self._running
        self._running = run
        self._emit(Governed(run, reason))
        if self._opt is None or not changed:
            return
        self._opt.pause(not run)
        self._spawn(self._client.send(Availability(paused=not run)))
        if run:
            self._check_behind()

    def apply_limits(self, limits: Limits) -> None:
        self.options.limits = limits
        self.gate.set_cpu_percent(limits.cpu_percent)
        self.upload.set_rate(limits.max_upload_kbps * 1000.0 if limits.max_upload_kbps else None)
        self.download.set_rate(limits.max_download_kbps * 1000.0 if limits.max_download_kbps else None)
        if self._mesh is not None:
            self._mesh.set_download_cap(self.download.rate)
        if self._opt is not None and (limits.threads or self.options.threads):
            self._spawn(self._opt.set_threads(limits.threads or self.options.threads))
        if self._opt is not None:
            self._spawn(self._compute_on(choose_device(limits.use_gpu)))

    async def _compute_on(self, placement: Placement) -> None:
        if placement != self._placement:
            self._placement = placement
            await self.optimizer.set_compute_device(placement.device)
            log.info("computing on %s", placement.description)
            self._emit(ComputingOn(placement.description))

    def _all_links_relayed(self) -> bool:
        paths = [p for p in self.mesh.paths().values() if p]
        return bool(paths) and all(p == "relay" for p in paths)

    def traffic(self) -> LinkCounters:
        return self._mesh.totals() if self._mesh is not None else LinkCounters()

    def stop(self, reason: str = "stopped") -> None:
        self._stop_reason = self._stop_reason or reason
        self._stop.set()

    async def run(self) -> str:
        """Train until ``max_epochs``, ``stop()`` or the backbone is gone for good; returns why."""
        loops: list[asyncio.Task] = []
        try:
            await self._start()
            control = asyncio.ensure_future(self._control_loop())
            training = asyncio.ensure_future(self._training_loop())
            heartbeat = asyncio.ensure_future(self._heartbeat_loop())
            stopping = asyncio.ensure_future(self._stop.wait())
            loops = [control, training, heartbeat, stopping]
            self._spawn(self._first_sync())
            done, _ = await asyncio.wait(loops, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if not task.cancelled() and task.exception():
                    raise task.exception()  # type: ignore[misc]
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await self._shutdown()
        self._emit(Stopped(self._stop_reason))
        return self._stop_reason

    async def _start(self) -> None:
        opts = self.options
        threads = opts.threads or opts.limits.threads
        if threads:
            torch.set_num_threads(threads)
        addresses = opts.ice_addresses
        if addresses is None and is_loopback_host(urlparse(opts.backbone_url).hostname or ""):
            addresses = ["127.0.0.1"]
        restrict_host_addresses(addresses)
        reply = await self._client.join()
        self.peer_id = reply.peer_id
        project = reply.project
        log.info("joined %s as %s", project.id, self.peer_id)
        self._emit(Joined(self.peer_id, project, reply.username))
        self._task = await asyncio.to_thread(create_task, project.task, project.task_params,
                                             opts.data_dir)
        model = self._fresh_model()
        self.gate.install(model)
        optimizer = build_optimizer(project.optimizer, model.parameters())
        relay_only = self._relay_only = opts.relay_only or reply.ice_policy == "relay"
        self._mesh = PeerMesh(self.peer_id, self._signal, ice_configuration(reply.ice_servers, relay_only),
                              self._mailbox, self._on_frame, self._on_incoming,
                              max_payload=reply.max_checkpoint_bytes, upload=self.upload)
        self._opt = CollaborativeOptimizer(
            model, optimizer, project.schedule, project_id=project.id, me=self.peer_id,
            averager=self._average, send=self._client.send,
            clip_grad_norm=project.optimizer.clip_grad_norm,
            report_interval=reply.report_interval, target_batch_size=project.target_batch_size,
            gate=self.gate,
        )
        self._client.upload, self._client.download = self.upload, self.download
        self._opt.client_mode = lambda: relay_only or self._all_links_relayed()
        self.apply_limits(opts.limits)
        if not self._running:
            self._opt.pause(True)
        self._sync = StateSync(self._client, self._mesh, self._mailbox, self._opt,
                               self._fresh_model, self._emit)

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
            self.gate.abandon(True)  # a long micro-batch (a small CPU share) must not delay exit
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
        while True:
            async for msg in self._client.messages():
                self._dispatch(msg)
            if self._stop.is_set():
                return
            reason = self._client.close_reason
            log.warning("lost the backbone (%s); reconnecting", reason)
            self._emit(Connection(False, f"lost the backbone ({reason}); reconnecting"))
            try:
                await self._client.reconnect(self._stop, self.options.reconnect_for)
            except BackboneError as exc:
                self.stop(f"lost the backbone: {exc}")
                return
            self._emit(Connection(True, "reconnected to the backbone"))
            opt = self.optimizer
            if not self._running:
                await self._client.send(Availability(paused=True))
            if opt.synced and not self.state_sync.busy:
                # The backbone may have restarted: tell it where we are, keep what we accumulated,
                # and how our last step went, in case it died before recording that step.
                last = opt.last_step
                if last is not None and last.epoch + 1 == opt.epoch:
                    await self._client.send(last)
                await self._client.send(Ready(opt.epoch, await opt.params_sha256()))
                await opt.report_progress(force=True)
            elif not self.state_sync.busy:
                self._spawn(self._resync())

    def _dispatch(self, msg: object) -> None:
        if isinstance(msg, Signal):
            self._spawn(self.mesh.handle_signal(msg.peer, msg.data))
        elif isinstance(msg, SyncPlan):
            self._collab_epoch = msg.epoch
            self.state_sync.plan_arrived(msg)
        elif isinstance(msg, RoundStart):
            self._spawn(self._round(msg))
        elif isinstance(msg, EpochAdvanced):
            self._collab_epoch = msg.epoch
            self.optimizer.observe_epoch(msg.epoch)
            self._check_behind()
        elif isinstance(msg, Resync):
            log.info("resync requested: %s", msg.reason)
            self._collab_epoch = msg.epoch
            if self._running:
                self._spawn(self._resync())
            else:
                self._resync_on_resume = True
        elif isinstance(msg, Status):
            self.status = msg
            self.optimizer.observe(msg)
            self._collab_epoch = msg.epoch
            self._emit(StatusChanged(msg, self.traffic()))
        elif isinstance(msg, IceServers):
            self.mesh.config = ice_configuration(msg.servers, self._relay_only)
        elif isinstance(msg, Error):
            log.error("backbone: %s", msg.message)
            self.stop(f"backbone refused: {msg.message}")

    def _check_behind(self) -> None:
        """Catch up with the collaboration, unless paused: a download then would take the
        machine its owner asked back; ``set_running`` checks again on resume."""
        opt = self.optimizer
        if not self._running:
            return
        if self._resync_on_resume:
            self._resync_on_resume = False
            self._spawn(self._resync())
        elif opt.synced and not opt.in_round and opt.epoch < self._collab_epoch:
            log.info("behind the collaboration (epoch %d < %d)", opt.epoch, self._collab_epoch)
            self._spawn(self._resync())

    async def _first_sync(self) -> None:
        if not await self.state_sync.sync():
            self.stop("could not obtain the collaboration's state")

    async def _resync(self) -> None:
        if not await self.state_sync.resync():
            self.stop("could not obtain the collaboration's state")

    # --- rounds -------------------------------------------------------------------------

    async def _average(self, plan: RoundPlan, vector: torch.Tensor, samples: int, loss_sum: float,
                       timeout: float) -> Averaged:
        try:
            return await butterfly_allreduce(plan, vector, samples, loss_sum, self.mesh, timeout)
        except AveragingError as exc:
            # A NAT that rebound or a relay that restarted leaves a link that looks open and
            # carries nothing: renegotiate it through the backbone next time it is needed.
            for peer in exc.suspects:
                self._spawn(self.mesh.drop(peer))
            raise

    async def _round(self, start: RoundStart) -> None:
        result = await self.optimizer.run_round(start)
        self._last_round = max(self._last_round, start.round_id)
        self._mailbox.discard(lambda key: key[0] not in ("part", "result") or key[1] > self._last_round)
        if result is None:
            if self.peer_id in start.group:
                self._emit(RoundFailed(start.epoch, "averaging failed"))
            self._check_behind()
            return
        self.history.append(result)
        self._collab_epoch = max(self._collab_epoch, result.epoch)
        self._emit(EpochCompleted(result, self.mesh.paths()))
        if start.checkpoint_by == self.peer_id:
            self._uploads.add(self._spawn(self._upload_checkpoint()))
        if self.options.max_epochs is not None and result.epoch >= self.options.max_epochs:
            self.stop(f"reached epoch {result.epoch}")

    async def _upload_checkpoint(self) -> None:
        index, payload = await self.optimizer.snapshot()
        data = encode_file(index, payload)
        epoch = index["meta"]["epoch"]
        try:
            await self._client.upload_checkpoint(epoch, data, index["meta"]["params_sha256"])
            log.info("uploaded the checkpoint of epoch %d (%.1f MB)", epoch, len(data) / 1e6)
        except BackboneError as exc:
            log.warning("checkpoint upload failed: %s", exc)

    # --- training -----------------------------------------------------------------------

    async def _training_loop(self) -> None:
        opts, task, opt = self.options, self._task, self.optimizer
        assert task is not None
        seed = opts.data_seed if opts.data_seed is not None else int(self.peer_id[:15], 16)
        for index in itertools.count():
            def micro_batch(index: int = index) -> tuple[int, float]:
                batch = task.batch(seed, index).to(opt.compute_device)
                loss_sum = task.loss(opt.compute_model, batch) * batch.size
                loss_sum.backward()
                return batch.size, float(loss_sum.detach())

            await opt.compute(micro_batch, index)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT / 2)
            await self.optimizer.keep_alive(HEARTBEAT)

    # --- data plane ---------------------------------------------------------------------

    def _on_frame(self, sender: str, frame: Frame) -> None:
        kind = frame.type
        if kind not in DATA_TYPES:
            log.warning("ignoring frame of unknown type %r from %s", kind, sender)
        elif kind in (StateRequest.TYPE, StateReply.TYPE, StateUnavailable.TYPE):
            task = self.state_sync.on_frame(sender, frame)
            if task is not None:
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        else:
            round_id = frame.header.get("round_id")
            if not isinstance(round_id, int) or isinstance(round_id, bool):
                log.warning("ignoring %s frame without a round id from %s", kind, sender)
            elif round_id > self._last_round:  # a straggler from a finished round is dropped
                self._mailbox.put((kind, round_id, sender), frame)

    def _on_incoming(self, sender, incoming) -> None:
        self.state_sync.on_incoming(sender, incoming)
