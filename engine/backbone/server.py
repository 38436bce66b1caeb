"""The backbone server: wiring of catalog, trackers, store, checkpoint files and HTTP routes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from engine.backbone import api
from engine.backbone.checkpoints import CheckpointFiles
from engine.backbone.sessions import PeerSession
from engine.backbone.store import Store
from engine.backbone.tracker import Broadcast, EpochRecord, Out, Send, Tracker
from engine.project import ProjectSpec, load_catalog
from engine.resources import default_catalog
from engine.wire.messages import CheckpointInfo, encode

log = logging.getLogger(__name__)
BACKBONE_KEY: web.AppKey[Backbone] = web.AppKey("backbone")


@dataclass
class BackboneConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    catalog: Path = field(default_factory=default_catalog)
    ice_servers: list[dict] = field(default_factory=list)
    peer_timeout: float = 15.0
    report_interval: float = 0.5
    status_interval: float = 1.0
    max_checkpoint_bytes: int = 1 << 30


class Backbone:
    def __init__(self, config: BackboneConfig, projects: list[ProjectSpec] | None = None) -> None:
        self.config = config
        self.store = Store(config.data_dir / "backbone.sqlite3")
        self.files = CheckpointFiles(config.data_dir / "checkpoints")
        specs = projects if projects is not None else load_catalog(config.catalog)
        self.projects = {p.id: p for p in specs}
        self.trackers: dict[str, Tracker] = {}
        for spec in specs:
            epoch, digest = self.store.collaboration(spec.id)
            saved = self.store.checkpoints(spec.id)
            self.trackers[spec.id] = Tracker(
                spec, epoch=epoch, params_sha256=digest,
                checkpoint=saved[0][0] if saved else None, peer_timeout=config.peer_timeout,
            )
        self.sessions: dict[str, PeerSession] = {}
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._ticker: asyncio.Task | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[api.errors_as_json], client_max_size=api.MAX_JSON_BODY)
        app[BACKBONE_KEY] = self
        api.add_routes(app)
        return app

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        self._ticker = asyncio.ensure_future(self._tick_forever())
        return self.url

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        for session in list(self.sessions.values()):
            await session.ws.close(message=b"backbone shutting down")
        if self._runner is not None:
            await self._runner.cleanup()
        self.store.close()

    async def _tick_forever(self) -> None:
        loop = asyncio.get_running_loop()
        next_status = loop.time()
        while True:
            await asyncio.sleep(0.25)
            for pid, tracker in self.trackers.items():
                self.execute(pid, tracker.tick())
            if loop.time() >= next_status:
                next_status = loop.time() + self.config.status_interval
                for pid, tracker in self.trackers.items():
                    self.execute(pid, [Broadcast(tracker.status())])

    def execute(self, project: str, outs: list[Out]) -> None:
        """Carry out what a tracker decided: send, broadcast, record."""
        for out in outs:
            if isinstance(out, Send):
                session = self.sessions.get(out.to)
                if session is not None:
                    session.send(encode(out.msg))
            elif isinstance(out, Broadcast):
                text = encode(out.msg)
                for session in self.sessions.values():
                    if session.project == project:
                        session.send(text)
            elif isinstance(out, EpochRecord):
                self.store.record_epoch(project, out)

    def checkpoint_stored(self, project: str, peer_id: str, info: CheckpointInfo, path: Path) -> None:
        self.store.add_checkpoint(project, info, path.name)
        self.trackers[project].checkpoint_stored(peer_id, info)
        keep = self.projects[project].keep_checkpoints
        for old, _ in self.store.checkpoints(project)[keep:]:
            self.store.remove_checkpoint(project, old.epoch)
            self.files.remove(self.files.path(project, old.epoch))
        log.info("%s: stored checkpoint of epoch %d (%.1f MB)", project, info.epoch, info.size / 1e6)

    def project_summary(self, spec: ProjectSpec) -> dict:
        status = self.trackers[spec.id].status()
        return {**api.project_json(spec), "epoch": status.epoch, "peers": status.peers,
                "samples": status.samples, "samples_per_second": round(status.samples_per_second, 2),
                "eta_seconds": status.eta_seconds}


async def serve(config: BackboneConfig, ready_message: bool = True) -> None:
    """Run a backbone until cancelled."""
    backbone = Backbone(config)
    url = await backbone.start()
    if ready_message:
        print(f"backbone listening on {url}", flush=True)
    log.info("projects: %s", json.dumps(sorted(backbone.projects)))
    try:
        await asyncio.Event().wait()
    finally:
        await backbone.stop()
