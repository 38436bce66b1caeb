"""One peer of a collaboration, from joining to leaving.

Four activities share one event loop, each in its own module: the control loop
(backbone_loop.py: messages from the backbone, reconnecting when it goes away), the
training loop (training_loop.py: micro-batches on the compute thread), rounds (rounds.py
and round_pipeline.py: opened by the backbone, averaged over the mesh) and state downloads
(state_sync.py: whenever the peer is behind). This module owns the peer's life: start, the
governor's controls, shutdown."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from engine.aio import cancel_and_wait
from engine.averaging.powersgd import warm_shapes_of
from engine.governor.limits import Limits
from engine.governor.throttle import ComputeGate
from engine.peer.backbone_loop import ControlLoop
from engine.peer.background import PeerTasks, describe
from engine.peer.bandwidth import Bandwidth
from engine.peer.checking import Audits
from engine.peer.client import PROJECT_CHANGED, ControlClient
from engine.peer.events import ComputingOn, EpochCompleted, Governed, Joined, PeerEvent, Stopped
from engine.peer.links import all_links_relayed, keep_measured, offered_addresses, reported_link
from engine.peer.options import PeerOptions
from engine.peer.progress import ProgressReporter
from engine.peer.project_data import project_task
from engine.peer.round_pipeline import RoundPipeline
from engine.peer.rounds import Rounds
from engine.peer.saved_state import carried_state, save_state
from engine.peer.state_sync import StateSync
from engine.peer.training_loop import data_seed, heartbeat_loop, training_loop, warm_up
from engine.project import ProjectSpec
from engine.shards.files import FetchedFiles
from engine.shards.jsonl import ShardError
from engine.tasks import Task, initial_model
from engine.tasks.hf_models import ModelError, failed_on_a_batch
from engine.training.device import Placement, choose_device
from engine.training.local import LocalSteps
from engine.training.lr_schedule import build_optimizer, collaboration_optimizer
from engine.training.optimizer import CollaborativeOptimizer
from engine.training.params import trainable
from engine.training.state import state_budget
from engine.transport.backends import restrict_host_addresses
from engine.transport.counters import LinkCounters
from engine.transport.ice import ice_configuration
from engine.transport.mailbox import Mailbox
from engine.transport.mesh import PeerMesh
from engine.transport.shaping import RateLimiter
from engine.wire.control import Availability, Status
from engine.wire.types import IcePolicy

log = logging.getLogger(__name__)
CHECKPOINT_UPLOAD_TIMEOUT = 120.0


@dataclass(frozen=True)
class JoinedPeer:
    """What a training peer runs with once it has joined, built whole in one go: none of it
    is ever missing, and before the join there is none of it. (The mesh is apart: an
    auxiliary peer, which trains nothing, has one too.)"""

    task: Task
    files: FetchedFiles | None  # (a project with no data files has none)
    optimizer: CollaborativeOptimizer
    progress: ProgressReporter
    pipeline: RoundPipeline
    state_sync: StateSync


class Peer:
    """One volunteer's membership of one collaboration, from joining to leaving: it owns the
    control socket, the mesh of links, the optimizer and the reporters, and hands the work
    to them (control: ControlLoop, rounds: Rounds, state: StateSync, checks: Audits). A
    background job that fails stops nothing but itself; an error of the peer's own stops it
    with the reason."""

    def __init__(self, options: PeerOptions, on_event: Callable[[PeerEvent], None] | None = None) -> None:
        self.options = options
        self.history: list[EpochCompleted] = []
        self.status: Status | None = None
        self.peer_id = ""
        self.emit = on_event or (lambda event: None)
        self.client = ControlClient(options.backbone_url, options.project_id,
                                    options.name or f"peer-{os.getpid()}", options.user_token)
        self.mailbox = Mailbox()
        self.collab_epoch = 0  # the collaboration's epoch, as last heard
        self.relay_only = options.relay_only
        self.rounds = Rounds(self)
        self.audits = Audits(self)
        self.control = ControlLoop(self)
        self.gate = ComputeGate(options.limits.cpu_percent, options.slowdown)
        self.upload = RateLimiter()
        self.download = RateLimiter()
        self.bandwidth = Bandwidth()
        self._stop = asyncio.Event()
        self._stop_reason = ""
        self.carried: bytes | None = None  # the state held when the project changed (for the next peer)
        self.tasks = PeerTasks(lambda error: self.stop(f"internal error: {describe(error)}"))
        self.spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task] = self.tasks.spawn
        self.chore: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task] = self.tasks.chore
        self.track: Callable[[asyncio.Task], None] = self.tasks.track
        self._joined: JoinedPeer | None = None
        self._mesh: PeerMesh | None = None
        self._running = True
        # (epoch, hash) the backbone told us to resync to while paused: done on resume
        self._resync_on_resume: tuple[int, str | None] | None = None
        self._placement: Placement | None = None

    @property
    def project(self) -> ProjectSpec:
        """The project as the backbone described it when we joined."""
        assert self.client.join_reply is not None
        return self.client.join_reply.project

    def _joined_peer(self) -> JoinedPeer:
        """What the peer trains with; only once it has joined (``joined``)."""
        assert self._joined is not None, "the peer has not joined yet"
        return self._joined

    @property
    def joined(self) -> bool:
        return self._joined is not None

    @property
    def optimizer(self) -> CollaborativeOptimizer:
        return self._joined_peer().optimizer

    @property
    def progress(self) -> ProgressReporter:
        return self._joined_peer().progress

    @property
    def pipeline(self) -> RoundPipeline:
        return self._joined_peer().pipeline

    @property
    def mesh(self) -> PeerMesh:
        assert self._mesh is not None, "the peer has not joined yet"
        return self._mesh

    @property
    def state_sync(self) -> StateSync:
        return self._joined_peer().state_sync

    @property
    def task(self) -> Task:
        return self._joined_peer().task

    @property
    def stopping_event(self) -> asyncio.Event:
        return self._stop

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
        self.emit(Governed(run, reason))
        if self._joined is None or not changed:
            return
        self._joined.optimizer.pause(not run)
        self.spawn(self.client.send(Availability(paused=not run)))
        if run:
            self.check_behind()

    def apply_limits(self, limits: Limits) -> None:
        self.options.limits = limits
        self.gate.set_cpu_percent(limits.cpu_percent)
        self.upload.set_rate(limits.max_upload_kbps * 1000.0 if limits.max_upload_kbps else None)
        self.download.set_rate(limits.max_download_kbps * 1000.0 if limits.max_download_kbps else None)
        if self._mesh is not None:
            self._mesh.set_download_cap(self.download.rate)
        if self._joined is None:
            return
        threads = limits.threads or self.options.threads
        if threads:
            self.spawn(self._joined.optimizer.thread.set_threads(threads))
        placement = choose_device(limits.use_gpu)

        async def compute_there() -> None:
            if placement != self._placement:
                self._placement = placement
                await self.optimizer.set_compute_device(placement.device)
                log.info("computing on %s", placement.description)
                self.emit(ComputingOn(placement.description))

        self.spawn(compute_there())

    def traffic(self) -> LinkCounters:
        return self._mesh.totals() if self._mesh is not None else LinkCounters()

    def stop(self, reason: str = "stopped") -> None:
        self._stop_reason = self._stop_reason or reason
        self._stop.set()

    # --- life ---------------------------------------------------------------------------

    async def run(self) -> str:
        """Train until ``max_epochs``, ``stop()`` or the backbone is gone for good; returns why."""
        loops: list[asyncio.Task] = []
        try:
            await self._start()
            loops = [asyncio.ensure_future(coro) for coro in self._loops()]
            done, _ = await asyncio.wait(loops, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                error = None if task.cancelled() else task.exception()
                if error is not None:
                    raise error
        finally:
            await cancel_and_wait(loops)
            await self._shutdown()
        self.emit(Stopped(self._stop_reason))
        return self._stop_reason

    def _loops(self) -> list[Coroutine[Any, Any, Any]]:
        """What runs until the peer stops (the first to end stops the rest), once started."""
        self.spawn(self._first_sync())
        self.spawn(keep_measured(self.bandwidth, self.client, self._stop))
        seed = data_seed(self.options.data_seed, self.peer_id)
        training = training_loop(self.task, self.optimizer, self.progress, self.project.precision, seed)
        return [self.control.run(), training, heartbeat_loop(self.progress), self._stop.wait()]

    async def _start(self) -> None:
        opts = self.options
        threads = opts.threads or opts.limits.threads
        if threads:
            torch.set_num_threads(threads)
        restrict_host_addresses(offered_addresses(opts))
        reply = await self.client.join()
        self.peer_id = reply.peer_id
        project = reply.project
        log.info("joined %s as %s", project.id, self.peer_id)
        self.emit(Joined(self.peer_id, project, reply.username))
        files_url = f"{self.client.base_url}/api/projects/{project.id}/files"
        task, files = await asyncio.to_thread(
            project_task, project, files_url, self.client.file_headers, opts.limits, opts.data_dir,
            asyncio.get_running_loop(), self.emit, self.download)
        # Off the loop: the first optimizer imports torch's compiler stack, seconds of CPU on a
        # busy machine that would otherwise starve this peer's sockets and links.
        seed = data_seed(opts.data_seed, self.peer_id)
        model, optimizer, micro_batch_seconds = await asyncio.to_thread(built, task, project, seed)
        self.gate.install(model, micro_batch_seconds)
        # In local mode the project's optimizer steps this peer's own copy of the model.
        local = LocalSteps(project.local, partial(build_optimizer, project.optimizer),
                           project.optimizer.clip_grad_norm) if project.mode == "local" else None
        # No honest frame is larger than this model's state: a peer's is refused at its first chunk.
        max_frame = min(state_budget(model, optimizer), reply.max_checkpoint_bytes)
        self.mailbox.max_bytes, self.mailbox.max_total = 2 * max_frame, 4 * max_frame
        relay_only = self.relay_only = opts.relay_only or reply.ice_policy is IcePolicy.RELAY
        ice = ice_configuration(reply.ice_servers, relay_only)
        self._mesh = mesh = PeerMesh(self.peer_id, self.control.signal, ice, self.mailbox,
                                     self.rounds.on_frame, self.rounds.on_incoming, max_payload=max_frame,
                                     upload=self.upload)
        # PowerSGD starts each round from the last one's Q, which the state carries.
        warm = warm_shapes_of(project, trainable(model))
        opt = CollaborativeOptimizer(model, optimizer, project.schedule, project_id=project.id,
                                     clip_grad_norm=project.optimizer.clip_grad_norm,
                                     gate=self.gate, local=local, overlap=project.overlap, warm_shapes=warm)
        progress = ProgressReporter(opt, self.client.send, project.target_batch_size, reply.report_interval)
        progress.client_mode = lambda: relay_only or all_links_relayed(mesh)
        progress.link_estimate = partial(reported_link, self.bandwidth, self.upload, self.download)
        pipeline = RoundPipeline(opt, progress, self.rounds.average, self.client.send,
                                 me=self.peer_id, target_batch_size=project.target_batch_size,
                                 aggregation=project.aggregation, compression=project.compression)
        fresh_model = partial(initial_model, task, project.seed)
        sync = StateSync(self.client, mesh, self.mailbox, opt, progress, fresh_model, self.emit)
        self._joined = JoinedPeer(task, files, opt, progress, pipeline, sync)
        self.client.upload, self.client.download = self.upload, self.download
        self.apply_limits(opts.limits)
        if not self._running:
            opt.pause(True)

    async def _shutdown(self) -> None:
        # (First: a user waits for it, and the uploads below may take minutes.)
        stopped_again = False
        joined = self._joined
        if self.options.save_state is not None and joined is not None:
            if joined.optimizer.synced:
                try:
                    await save_state(joined.optimizer, Path(self.options.save_state))
                except asyncio.CancelledError:
                    stopped_again = True  # (saved) leave now: no wait for uploads
            else:
                log.warning("not saving the state: this peer holds none of the collaboration's")
        if self._stop_reason == PROJECT_CHANGED and joined is not None and joined.optimizer.synced:
            self.carried = await carried_state(joined.optimizer)
        pending = [t for t in self.rounds.uploads if not t.done()]
        if pending and not stopped_again:
            # The collaboration asked us for this checkpoint; if we are the last peer to
            # leave, it is the state the next one resumes from.
            await asyncio.wait(pending, timeout=CHECKPOINT_UPLOAD_TIMEOUT)
        self.tasks.cancel_all()
        if self._mesh is not None:
            await self._mesh.close()
        await self.client.close()
        if joined is not None and joined.files is not None:
            await joined.files.close()  # a micro-batch waiting for a shard gives up
        if joined is not None:
            joined.optimizer.thread.shutdown()
            joined.optimizer.hash.close()
        if stopped_again:
            raise asyncio.CancelledError

    # --- catching up --------------------------------------------------------------------

    def resync_later(self, epoch: int, state_sha256: str | None) -> None:
        """The backbone says our state is not the collaboration's: get the settled one now,
        or once the owner lets us run."""
        if self._running:
            self.spawn(self.resync(epoch, state_sha256))
        else:
            self._resync_on_resume = (epoch, state_sha256)

    def check_behind(self) -> None:
        """Catch up with the collaboration, unless paused: a download then would take the
        machine its owner asked back; ``set_running`` checks again on resume."""
        opt = self.optimizer
        if not self._running:
            return
        if self._resync_on_resume is not None:
            epoch, state_sha256 = self._resync_on_resume
            self._resync_on_resume = None
            self.spawn(self.resync(epoch, state_sha256))  # back to the kept state, if it is that
        elif opt.synced and not opt.in_round and opt.epoch < self.collab_epoch:
            log.info("behind the collaboration (epoch %d < %d)", opt.epoch, self.collab_epoch)
            self.spawn(self.resync())

    async def _first_sync(self) -> None:
        carried = self.options.carried_state
        if carried is not None and await self.state_sync.carry_on(carried):
            return
        if not await self.state_sync.sync():
            self.stop("could not obtain the collaboration's state")

    async def resync(self, epoch: int | None = None, state_sha256: str | None = None) -> None:
        if not await self.state_sync.resync(epoch, state_sha256):
            self.stop("could not obtain the collaboration's state")


def built(task: Task, project: ProjectSpec,
          seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, float]:
    """The project's model, warmed up (so the backbone times our pace from a warm start), its
    optimizer, and how long the warm-up's micro-batch took."""
    model = initial_model(task, project.seed)
    try:
        seconds = warm_up(task, model, project.precision, seed)
    except (ModelError, ShardError, OSError):
        raise  # (the task's and the data's own errors say what is wrong already)
    except Exception as exc:  # a configuration that builds a model its first batch breaks
        raise ModelError(failed_on_a_batch(exc)) from None
    return model, collaboration_optimizer(project, model), seconds
