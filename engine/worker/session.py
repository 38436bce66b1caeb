"""What the worker does, whatever front end drives it: an optional embedded backbone, one
project at a time (a ``Peer``), and one ``Governor`` that outlives projects, so a pause or
snooze survives switching projects. Everything it has to say goes out as protocol events.

A desktop app is started at login, before the network is up, beside backbones that restart:
whatever may pass -- a backbone that cannot be reached or does not answer, this computer's
backbone that cannot start -- is tried again after a growing pause, saying so, until the
user leaves the project. Only what cannot pass by waiting (a refused login, another
version) ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import sqlite3
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from engine.aio import finished_within
from engine.backbone.server import Backbone, BackboneConfig
from engine.backoff import Backoff
from engine.governor.governor import Governor
from engine.governor.limits import Limits
from engine.governor.policy import Decision
from engine.governor.throttle import lower_priority
from engine.paths import user_data_dir
from engine.peer.background import describe
from engine.peer.client import PROJECT_CHANGED, BackboneError
from engine.peer.events import Connection, EpochCompleted, FileProgress, Joined, PeerEvent, SyncProgress
from engine.peer.options import PeerOptions
from engine.peer.runner import Peer
from engine.problems import retrying
from engine.project import load_catalog
from engine.resources import default_catalog
from engine.urls import backbone_key
from engine.worker import protocol as p

log = logging.getLogger(__name__)
LOCAL_PORT = 8470
STATS_INTERVAL = 1.0
RETRY_FIRST = 4.0  # seconds before trying again (2-4 s), doubling up to RETRY_CAP
RETRY_CAP = 300.0
STABLE = 60.0  # a project that ran this long forgives the failures before it


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
        self._left = asyncio.Event()  # set when the project is left: ends a pause before a retry
        self._key = ""
        self._backbone_url = ""
        self._target = 0
        self._shown = (0, 0)  # the session's and the total samples last shown: they never go down
        self._earlier = 0  # samples of this project's earlier peers in this session (before a retry)
        self._lowered = False
        self._switch = asyncio.Lock()
        self._download_shown = 0.0

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
        """The embedded backbone's URL, starting it on first use (OSError if it cannot)."""
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
                raise OSError("no port to listen on")
            log.info("local backbone on %s", self.backbone.url)
            self.emit(p.Hosting(self.backbone.url))
        return self.backbone.url

    async def start(self, command: p.Start) -> None:
        async with self._switch:
            await self._leave("switching projects")
            self._leaving = False
            self._left = asyncio.Event()
            self._peer_task = asyncio.ensure_future(self._contribute(command))

    async def leave(self, reason: str) -> None:
        async with self._switch:
            await self._leave(reason)

    async def _leave(self, reason: str) -> None:
        if self._peer_task is None:
            return
        self._leaving = True
        self._left.set()
        if self.peer is not None:
            self.peer.stop(reason)
        await asyncio.gather(self._peer_task, return_exceptions=True)
        self._peer_task = None

    async def _contribute(self, command: p.Start) -> None:
        """Host if asked, join, train; try again after what may pass, until left."""
        backoff = Backoff(RETRY_FIRST, RETRY_CAP)
        local = command.backbone == p.LOCAL_BACKBONE
        reason = "you left the project"
        carried: bytes | None = None
        while not self._leaving:
            try:
                url = await self.host() if local else command.backbone
                key = p.LOCAL_BACKBONE if local else backbone_key(url)
            except ValueError as exc:  # an address no retry will mend
                reason = str(exc)
                self.emit(p.Problem(message=reason, fatal=True))
                break
            except (OSError, sqlite3.Error, RuntimeError) as exc:  # (a data folder it cannot use)
                log.warning("cannot start this computer's backbone: %s", exc)
                await self._retry_later(backoff, f"This computer's backbone could not start ({exc})",
                                        hosting=True)
                continue
            if self._leaving:
                break  # left while the backbone started: nobody would stop a peer started now
            if self._key != f"{key} {command.project}":
                self._shown, self._earlier = (0, 0), 0
            self._key, self._backbone_url = f"{key} {command.project}", url
            options = PeerOptions(backbone_url=url, project_id=command.project, name=command.name,
                                  user_token=command.token, limits=self.governor.limits,
                                  reconnect_for=math.inf, carried_state=carried)
            carried = None
            peer = Peer(options, self._peer_event)
            decision = self.governor.decision
            if decision is not None and not decision.run:
                peer.set_running(False, decision.reason)
            self.peer = peer
            began = time.monotonic()
            reason, failure = await self._run_peer(peer)
            if self._leaving or reason.startswith("reached epoch"):
                break
            if reason == PROJECT_CHANGED:
                carried = peer.carried
                continue  # (at once, from the state it held: its new version waits)
            if getattr(failure, "fatal", False):  # a refused login, a project this computer cannot take
                self.emit(p.Problem(message=reason, fatal=True))
                break
            if time.monotonic() - began > STABLE:
                backoff.reset()
            await self._retry_later(backoff, reason)
        self.emit(p.ProjectLeft(reason=reason))

    async def _retry_later(self, backoff: Backoff, sentence: str, hosting: bool = False) -> None:
        """Say what failed and when it is tried again; wait that long (or until left)."""
        wait = backoff.next()
        self.emit(p.Problem(message=retrying(sentence, wait)[:4000], retry_in=wait, hosting=hosting))
        await finished_within(self._left.wait(), wait)

    async def _run_peer(self, peer: Peer) -> tuple[str, BaseException | None]:
        """Why the peer stopped, and the failure that stopped it, if one did."""
        ticker = asyncio.ensure_future(self._stats_loop(peer))
        failure: BaseException | None = None
        try:
            reason = await peer.run()
        except (BackboneError, ValueError, OSError, asyncio.TimeoutError) as exc:
            reason, failure = str(exc) or type(exc).__name__, exc
        except Exception as exc:  # a bug in the engine must not take the worker (and hosting) down
            log.exception("the peer failed")
            reason, failure = f"internal error: {describe(exc)}", exc
        finally:
            ticker.cancel()
            self._earlier += sum(r.my_samples for r in peer.history)
            if self.peer is peer:
                self.peer = None
        return reason, failure

    def _peer_event(self, event: PeerEvent) -> None:
        self._on_peer_event(event)
        if isinstance(event, Connection):
            self.emit(p.ConnectionChanged(connected=event.connected, message=event.message))
        elif isinstance(event, Joined):
            self._target = event.project.target_batch_size
            self.emit(p.ProjectJoined(backbone=self._backbone_url, project=event.project.id,
                                      title=event.project.title, peer_id=event.peer_id,
                                      username=event.username))
        elif isinstance(event, EpochCompleted):
            self.tally.add(self._key, event.my_samples)
            self.emit(event)
        elif isinstance(event, (FileProgress, SyncProgress)):
            self._downloading(event)

    def _downloading(self, event: FileProgress | SyncProgress) -> None:
        """Forward a download's progress: its first and last word, and at most 4 a second between."""
        what = f"the project's {event.path}" if isinstance(event, FileProgress) else \
            f"the collaboration's state from {event.source}"
        now = time.monotonic()
        if event.received in (0, event.total) or now - self._download_shown >= 0.25:
            self._download_shown = now
            self.emit(p.Downloading(what=what[:4000], received=event.received, total=event.total))

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
        # While a round runs, what it took is neither in the accumulator nor, yet, in the
        # history: the running totals shown hold their highest (a chart that dipped at every
        # round looked like lost work).
        session = max(self._earlier + sum(r.my_samples for r in peer.history) + acc.samples, self._shown[0])
        total = max(self.tally.get(self._key) + acc.samples, self._shown[1])
        self._shown = (session, total)
        status = peer.status
        current = acc.loss_sum / acc.samples if acc.samples else None
        loss = peer.history[-1].step.loss if peer.history else current
        eta = status.eta_seconds if status is not None else None
        link = peer.bandwidth.estimate(peer.upload.rate, peer.download.rate)
        return p.Stats(
            samples_per_second=_finite(opt.throughput.rate()),
            my_samples_session=session,
            my_samples_total=total,
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
