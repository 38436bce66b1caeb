"""What the worker does, whatever front end drives it: an optional embedded backbone, one
project at a time (a ``Peer``), and one ``Governor`` that outlives projects, so a pause or
snooze survives switching projects. Everything it has to say goes out as protocol events.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from engine.backbone.server import Backbone, BackboneConfig
from engine.credentials import backbone_key
from engine.governor.governor import Governor
from engine.governor.limits import Limits
from engine.governor.policy import Decision
from engine.governor.throttle import lower_priority
from engine.paths import user_data_dir
from engine.peer.client import BackboneError
from engine.peer.events import EpochCompleted, Joined, PeerEvent
from engine.peer.runner import Peer, PeerOptions
from engine.project import load_catalog
from engine.resources import default_catalog
from engine.worker import protocol as p

log = logging.getLogger(__name__)
LOCAL_PORT = 8470
STATS_INTERVAL = 1.0


class Tally:
    """My credited samples per backbone and project on this computer, across sessions."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        self.entries: dict[str, int] = {k: v for k, v in data.items() if isinstance(v, int)} \
            if isinstance(data, dict) else {}

    def get(self, key: str) -> int:
        return self.entries.get(key, 0)

    def add(self, key: str, samples: int) -> None:
        self.entries[key] = self.get(key) + samples
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.entries))
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("cannot save the contribution tally: %s", exc)


class Session:
    def __init__(self, emit: Callable[[p.WorkerEvent], None], data_dir: Path | None = None,
                 catalog: Path | None = None,
                 on_peer_event: Callable[[PeerEvent], None] | None = None) -> None:
        self.emit = emit
        self.data_dir = data_dir or user_data_dir()
        self.catalog = catalog or default_catalog()
        self.governor = Governor(Limits(), on_change=self._decided)
        self.tally = Tally(self.data_dir / "worker" / "contribution.json")
        self.backbone: Backbone | None = None
        self.peer: Peer | None = None
        self._on_peer_event = on_peer_event or (lambda event: None)
        self._peer_task: asyncio.Task | None = None
        self._leaving = False
        self._key = ""
        self._backbone_url = ""
        self._target = 0
        self._lowered = False
        self._switch = asyncio.Lock()

    # --- the governor's target ----------------------------------------------------------

    def set_running(self, run: bool, reason: str) -> None:
        if self.peer is not None:
            self.peer.set_running(run, reason)

    def apply_limits(self, limits: Limits) -> None:
        if limits.low_priority and not self._lowered:
            lower_priority()  # one way only: an unprivileged process cannot raise it again
            self._lowered = True
        if self.peer is not None:
            self.peer.apply_limits(limits)

    def _decided(self, decision: Decision) -> None:
        self.emit(p.GovernorDecided(running=decision.run, state=decision.state, reason=decision.reason,
                                    limits=self.governor.limits))

    # --- commands -----------------------------------------------------------------------

    async def handle(self, command: p.Command) -> None:
        g = self.governor
        if isinstance(command, p.Start):
            await self.start(command)
        elif isinstance(command, p.Leave):
            await self.leave("you left the project")
        elif isinstance(command, p.SetLimits):
            g.set_limits(command.limits)
            if g.decision is not None:
                self._decided(g.decision)
        elif isinstance(command, p.Pause):
            g.pause()
        elif isinstance(command, p.Resume):
            g.resume()
        elif isinstance(command, p.RunNow):
            g.run_now()
        elif isinstance(command, p.Snooze):
            g.snooze(datetime.fromtimestamp(command.until))

    async def host(self) -> str:
        """The embedded backbone's URL, starting it on first use."""
        if self.backbone is None:
            projects = load_catalog(self.catalog)
            for port in (LOCAL_PORT, 0):
                backbone = Backbone(BackboneConfig(data_dir=self.data_dir / "local-backbone", port=port),
                                    projects)
                try:
                    await backbone.start()
                except OSError as exc:
                    backbone.store.close()
                    log.info("port %d is taken (%s); trying another", port, exc)
                    continue
                self.backbone = backbone
                break
            else:
                raise OSError("cannot start the local backbone")
            log.info("local backbone on %s", self.backbone.url)
            self.emit(p.Hosting(self.backbone.url))
        return self.backbone.url

    async def start(self, command: p.Start) -> None:
        async with self._switch:
            await self._leave("switching projects")
            try:
                local = command.backbone == p.LOCAL_BACKBONE
                url = await self.host() if local else command.backbone
                key = p.LOCAL_BACKBONE if local else backbone_key(url)
            except (OSError, ValueError) as exc:
                self.emit(p.Problem(message=str(exc), fatal=True))
                return
            self._key, self._backbone_url = f"{key} {command.project}", url
            options = PeerOptions(backbone_url=url, project_id=command.project, name=command.name,
                                  user_token=command.token, limits=self.governor.limits)
            peer = Peer(options, self._peer_event)
            decision = self.governor.decision
            if decision is not None and not decision.run:
                peer.set_running(False, decision.reason)
            self.peer, self._leaving = peer, False
            self._peer_task = asyncio.ensure_future(self._run_peer(peer))

    async def leave(self, reason: str) -> None:
        async with self._switch:
            await self._leave(reason)

    async def _leave(self, reason: str) -> None:
        if self.peer is None or self._peer_task is None:
            return
        self._leaving = True
        self.peer.stop(reason)
        await asyncio.gather(self._peer_task, return_exceptions=True)

    async def _run_peer(self, peer: Peer) -> None:
        ticker = asyncio.ensure_future(self._stats_loop(peer))
        try:
            reason = await peer.run()
        except (BackboneError, ValueError, OSError) as exc:
            reason = str(exc)
        except Exception as exc:  # a bug in the engine must not take the worker (and hosting) down
            log.exception("the peer failed")
            reason = f"internal error: {exc}"
        finally:
            ticker.cancel()
            if self.peer is peer:
                self.peer = None
        if not self._leaving and not reason.startswith("reached epoch"):
            self.emit(p.Problem(message=reason, fatal=True))
        self.emit(p.ProjectLeft(reason=reason))

    def _peer_event(self, event: PeerEvent) -> None:
        self._on_peer_event(event)
        if isinstance(event, Joined):
            self._target = event.project.target_batch_size
            self.emit(p.ProjectJoined(backbone=self._backbone_url, project=event.project.id,
                                      title=event.project.title, peer_id=event.peer_id,
                                      username=event.username))
        elif isinstance(event, EpochCompleted):
            self.tally.add(self._key, event.my_samples)
            self.emit(event)

    # --- stats --------------------------------------------------------------------------

    async def _stats_loop(self, peer: Peer) -> None:
        last = peer.traffic()
        last_time = time.monotonic()
        while True:
            await asyncio.sleep(STATS_INTERVAL)
            now, traffic = time.monotonic(), peer.traffic()
            span = max(now - last_time, 1e-3)
            up = (traffic.bytes_sent - last.bytes_sent) / span
            down = (traffic.bytes_received - last.bytes_received) / span
            last, last_time = traffic, now
            stats = self.stats(peer, up, down)
            if stats is not None:
                self.emit(stats)

    def stats(self, peer: Peer, up: float, down: float) -> p.Stats | None:
        if not peer.joined:
            return None
        opt = peer.optimizer
        acc = opt.accumulator
        session = sum(r.my_samples for r in peer.history) + acc.samples
        status = peer.status
        current = acc.loss_sum / acc.samples if acc.samples else None
        loss = peer.history[-1].step.loss if peer.history else current
        eta = status.eta_seconds if status is not None else None
        link = peer.bandwidth.estimate(peer.upload.rate, peer.download.rate)
        return p.Stats(
            samples_per_second=_finite(opt.throughput.rate()),
            my_samples_session=session,
            my_samples_total=self.tally.get(self._key) + acc.samples,
            collab_samples=status.samples if status else acc.samples,
            collab_target=status.target if status else self._target,
            eta_seconds=None if eta is None or not math.isfinite(eta) else eta,
            epoch=max(opt.epoch, status.epoch if status else 0),
            peers=status.peers if status else 1,
            upload_bps=_finite(up), download_bps=_finite(down),
            loss=None if loss is None or not math.isfinite(loss) else loss,
            device=peer.placement.description if peer.placement else "",
            link_upload_bps=link.upload, link_download_bps=link.download,
            mode=peer.project.mode, inner_steps=opt.local.steps if opt.local is not None else None,
        )

    async def run_governor(self) -> None:
        await self.governor.run(self)

    async def close(self) -> None:
        await self.leave("the worker is stopping")
        if self.backbone is not None:
            with contextlib.suppress(Exception):
                await self.backbone.stop()
            self.backbone = None


def _finite(value: float) -> float:
    return value if math.isfinite(value) else 0.0
