"""The backbone server: wiring of catalog, trackers, store, checkpoint files and HTTP routes."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgspec
from aiohttp import web

from engine.backbone import routes
from engine.backbone.accounts import PasswordWork
from engine.backbone.addresses import DEFAULT_IPV6_PREFIX
from engine.backbone.checkpoints import CheckpointFiles
from engine.backbone.connections import HEADER_TIMEOUT, ConnectionCap, listen
from engine.backbone.curve_events import CurveEvents
from engine.backbone.execution import execute
from engine.backbone.forwarding import forward_request, forward_socket
from engine.backbone.http import BACKBONE, errors_as_json
from engine.backbone.ice import IceConfig, ice_servers_for
from engine.backbone.leases import LeaseKeeper, LiveFigures
from engine.backbone.logins import LoginLimits
from engine.backbone.project_watch import ProjectWatch
from engine.backbone.rate_limits import LimitsConfig, Throttle
from engine.backbone.sessions import PeerSession
from engine.backbone.store.database import Unavailable
from engine.backbone.store.repositories import Store
from engine.backbone.tracker import Out, Tracker
from engine.project import ProjectSpec, load_catalog
from engine.project_folders import ProjectFolder
from engine.resources import default_catalog
from engine.wire.codec import encode_text
from engine.wire.control import CheckpointInfo, IceServers
from engine.wire.rest import ProjectSummary

log = logging.getLogger(__name__)
SEEN_INTERVAL = 10.0
PRUNE_INTERVAL = 600.0  # seconds between sweeps of peers long gone
TICK = 0.25  # seconds between deadline checks


@dataclass
class BackboneConfig:
    data_dir: Path
    database: str | None = None  # a PostgreSQL server's URL; None: an SQLite file in data_dir
    # How the other backbone processes on the database reach this one (default: its own URL).
    internal_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    catalog: Path = field(default_factory=default_catalog)
    projects_dir: Path | None = None  # project folders (engine/project_folders.py), besides the catalog
    builtin_projects: bool = True  # with the default catalog, its projects with data (engine/catalog_data/)
    ice: IceConfig = field(default_factory=IceConfig)
    peer_timeout: float = 15.0
    recovery: float = 60.0  # after a restart, how long the peers get to come back (their backoff's cap)
    report_interval: float = 0.5
    status_interval: float = 1.0
    max_checkpoint_bytes: int = 1 << 30
    # Default: data_dir/checkpoints. Processes sharing a database share this folder too.
    checkpoints_dir: Path | None = None
    advertise: bool = False  # announce on the LAN with mDNS
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    trusted_proxies: frozenset[str] = frozenset()  # their X-Forwarded-For names the client
    ipv6_prefix: int = DEFAULT_IPV6_PREFIX  # per-address limits count IPv6 by this prefix
    equal_shares: bool = False  # every reducer the same share: DeDLOC's LP off
    tensorboard_dir: Path | None = None  # each project's curve as TensorBoard events (curve_events.py)


MOVED = b"the coordinator moved; reconnect"


class Backbone:
    """The always-on server a project's owner runs: accounts, signaling, one Tracker per
    project, the record (steps, curve, ledger, checkpoints) in SQLite or PostgreSQL. It is
    trusted; the peers it serves are not, so what they send is checked here before it
    moves anything."""

    def __init__(self, config: BackboneConfig, projects: list[ProjectSpec] | None = None) -> None:
        self.config = config
        # The backbone's user's alone, on every start: an older version or a copy may have
        # left the folder, the database (Store) or the checkpoints (tidy) readable.
        config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        config.data_dir.chmod(0o700)
        self.store = Store(config.database or config.data_dir / "backbone.sqlite3")
        self.store.peers.close_stale_sessions()
        self._prune_peers()
        self.files = CheckpointFiles(config.checkpoints_dir or config.data_dir / "checkpoints")
        self.files.tidy()
        self.curve_events = CurveEvents(config.tensorboard_dir) if config.tensorboard_dir else None
        self.projects: dict[str, ProjectSpec] = {}
        self.folders: dict[str, ProjectFolder] = {}
        self.trackers: dict[str, Tracker] = {}
        # Rounds that opened but were never recorded (the backbone died mid-round) used ids
        # past the last recorded one, and peers ignore frames of rounds they have seen: so
        # continue from the clock, never from a number a previous run may have handed out.
        self._last_round = max(self.store.rounds.last_round_id(), int(time.time() * 1000))
        # On a shared database, each project's tracker runs where its lease is (leases.py).
        self.leases = LeaseKeeper(self) if config.database is not None else None
        self._forwarder: aiohttp.ClientSession | None = None
        self._keeping: asyncio.Task | None = None
        self._closing: set[asyncio.Future] = set()  # sockets of projects another process took
        for spec in projects if projects is not None else load_catalog(config.catalog):
            self.add_project(spec)
        self.watch = ProjectWatch(self, config.projects_dir) if config.projects_dir else None
        if self.watch is not None:
            self.watch.load_all()
        # The default catalog's projects with data are written from what is installed, off
        # the loop: each is offered once its folder is ready (engine/catalog_data/).
        self._builtin = projects is None and config.catalog == default_catalog() and config.builtin_projects
        self.sessions: dict[str, PeerSession] = {}
        self.throttle = Throttle(config.limits)
        self.logins = LoginLimits(config.limits)
        self.password_work = PasswordWork(config.limits.password_hashes_at_once)
        self.connections = ConnectionCap(config.limits.connections_per_address, config.ipv6_prefix,
                                         config.trusted_proxies)
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self._ticker: asyncio.Task | None = None
        self._watching: asyncio.Task | None = None
        self._building: asyncio.Future | None = None

    def add_project(self, spec: ProjectSpec, folder: ProjectFolder | None = None) -> None:
        if spec.id in self.projects:
            raise ValueError(f"two projects have the id {spec.id!r}")
        for info in self.store.checkpoints.listed(spec.id):
            self.files.adopt(spec.id, info.epoch, info.sha256)
        if self.store.migrated_hashes:
            self._rehash_checkpoints(spec.id)
        if folder is not None:
            self.folders[spec.id] = folder
        self.projects[spec.id] = spec
        if self.leases is None:  # alone on its database: every project's tracker is ours
            self.start_tracker(spec.id)

    def start_tracker(self, project: str) -> None:
        """Run ``project``'s tracker here, from the settled record (after another process
        held it, as after a restart: the round in flight is settled by its members' replay)."""
        spec = self.projects[project]
        epoch, digest = self.store.rounds.collaboration(project)
        saved = self.store.checkpoints.listed(project)
        self._last_round = max(self._last_round, self.store.rounds.last_round_id(), int(time.time() * 1000))
        self.trackers[project] = Tracker(
            spec, epoch=epoch, state_sha256=digest, checkpoint=saved[0] if saved else None,
            peer_timeout=self.config.peer_timeout, last_round_id=self._last_round,
            unsettled=self.store.rounds.unsettled_round(project), recovery=self.config.recovery,
            equal_shares=self.config.equal_shares,
        )

    def stop_tracker(self, project: str, why: str, close: bytes = MOVED) -> None:
        """Stop ``project``'s tracker (another process runs it now, or the project changed):
        its peers' sockets close, and they reconnect to the holder through any process."""
        if self.trackers.pop(project, None) is None:
            return
        log.warning("%s: stopped the project's tracker here: %s", project, why)
        for session in [s for s in self.sessions.values() if s.project == project]:
            moved = session.ws.close(code=1012, message=close)
            closing = asyncio.ensure_future(moved)
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    async def _offer_builtin_projects(self) -> None:
        from engine.catalog_data import BUILDERS, builtin_folder

        for name in BUILDERS:
            folder = await asyncio.to_thread(builtin_folder, self.config.data_dir / "projects", name)
            if folder is not None and folder.spec.id not in self.projects:
                self.add_project(folder.spec, folder)
                log.info("offering %s (%s)", folder.spec.id, folder.spec.title)

    async def projects_ready(self) -> None:
        if self._building is not None:
            await asyncio.gather(self._building, return_exceptions=True)

    def _rehash_checkpoints(self, project: str) -> None:
        """After an upgrade from parameter hashes to state hashes: the stored checkpoints'
        hashes are computed from their files, and the collaboration continues from the
        latest one's if it holds the current epoch (else peers' majority settles it)."""
        epoch, _ = self.store.rounds.collaboration(project)
        for info in self.store.checkpoints.listed(project):
            digest = self.files.state_sha256(info.sha256)
            if digest is None:
                self.store.checkpoints.remove(project, info.epoch)
                continue
            self.store.checkpoints.update_hash(project, info.epoch, digest)
            if info.epoch == epoch:
                self.store.rounds.set_collaboration(project, epoch, digest)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[errors_as_json])
        app[BACKBONE] = self
        routes.add_routes(app)
        return app

    async def start(self) -> str:
        # aiohttp's keep-alive timer runs from a connection's start and from each answer,
        # and closes the connection if no whole request head came by then: a header timeout
        # and an idle timeout in one (connections.py).
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=2,
                                     keepalive_timeout=HEADER_TIMEOUT)
        await self._runner.setup()
        assert self._runner.server is not None
        self._listener = await listen(self._runner.server, self.config.host, self.config.port,
                                      self.connections)
        host, port = self._listener.sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        self._ticker = asyncio.ensure_future(self._tick_forever())
        if self.watch is not None:
            self._watching = asyncio.ensure_future(self.watch.run())
        if self.leases is not None:
            # No cap on connections: each relayed control socket holds one for as long as it lives
            # (aiohttp's default of 100 left the 101st peer through this process waiting, then 503).
            unlimited = aiohttp.TCPConnector(limit=0)
            self._forwarder = aiohttp.ClientSession(connector=unlimited, auto_decompress=False)
            self.leases.renew()  # our projects' trackers start before the first peer comes
            self._keeping = asyncio.ensure_future(self.leases.run())
        if self._builtin:
            self._building = asyncio.ensure_future(self._offer_builtin_projects())
        return self.url

    async def stop(self) -> None:
        await self.projects_ready()  # a thread writing a folder cannot be cut short
        for task in (self._ticker, self._keeping, self._watching):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.leases is not None:
            self.leases.release()
        for session in list(self.sessions.values()):
            await session.ws.close(message=b"backbone shutting down")
        if self._listener is not None:
            self._listener.close()  # no new connections; cleanup closes the open ones
        if self._runner is not None:
            await self._runner.cleanup()
        if self._listener is not None:
            await self._listener.wait_closed()
        if self._forwarder is not None:
            await self._forwarder.close()
        if self.curve_events is not None:
            self.curve_events.close()
        self.store.close()

    def _prune_peers(self) -> None:
        pruned = self.store.peers.prune()
        if pruned:
            log.info("forgot %d peers that never connected or left long ago", pruned)

    async def _tick_forever(self) -> None:
        loop = asyncio.get_running_loop()
        next_seen = loop.time()
        next_prune = loop.time() + PRUNE_INTERVAL
        # Each peer hears the status once per status_interval, a slice of the peers per tick:
        # a thousand sockets written at once held every other message up by tens of ms.
        slices = max(1, round(self.config.status_interval / TICK))
        for tick in itertools.count():
            await asyncio.sleep(TICK)
            for pid, tracker in self.trackers.items():
                self.execute(pid, tracker.tick())
            part = tick % slices
            for pid, tracker in self.trackers.items():
                status, counted = tracker.status_and_counted()
                texts = encode_text(status), encode_text(msgspec.structs.replace(status, counts_you=False))
                for session in self.sessions.values():
                    if session.project == pid and hash(session.peer_id) % slices == part:
                        session.send(texts[session.peer_id not in counted])
            if loop.time() >= next_seen:
                # Online time survives a crash up to the last time peers were seen.
                next_seen = loop.time() + SEEN_INTERVAL
                self.store.peers.seen(list(self.sessions))
                self.renew_ice_credentials(time.time())
            if loop.time() >= next_prune:
                next_prune = loop.time() + PRUNE_INTERVAL
                self._prune_peers()

    def send_ice_servers(self, session: PeerSession, now: float | None = None) -> None:
        """Fresh ICE servers for the peer's next links. TURN credentials expire after
        ``turn_ttl`` (coturn checks them only when a relay is allocated, so links already up
        live on); they are renewed at half their life."""
        now = now if now is not None else time.time()
        ice = self.config.ice
        session.send(encode_text(IceServers(ice_servers_for(ice, session.peer_id, now))))
        session.ice_renew_at = now + ice.turn_ttl / 2 if ice.turn_urls else float("inf")

    def renew_ice_credentials(self, now: float) -> None:
        for session in list(self.sessions.values()):
            if now >= session.ice_renew_at:
                self.send_ice_servers(session, now)

    def execute(self, project: str, outs: list[Out]) -> None:
        """Carry out what ``project``'s tracker decided (engine/backbone/execution.py)."""
        execute(self, project, outs)

    def online_users(self, project: str) -> set[int]:
        return {s.user_id for s in self.sessions.values()
                if s.project == project and s.user_id is not None}

    async def checkpoint_stored(self, project: str, peer_id: str, info: CheckpointInfo) -> bool:
        """Record an upload whose file is in place; False if the file went as it was
        recorded (another process's removal): the uploader is told, and the next
        checkpoint takes its place."""
        self.store.checkpoints.add(project, info)
        if not self.files.path(info.sha256).is_file():
            self.store.checkpoints.remove(project, info.epoch)
            log.warning("%s: the checkpoint of epoch %d was removed as it was recorded", project, info.epoch)
            return False
        self.trackers[project].checkpoint_stored(peer_id, info)
        keep = self.projects[project].keep_checkpoints
        try:
            for old in self.store.checkpoints.listed(project)[keep:]:
                self.store.checkpoints.remove(project, old.epoch)
                if not self.store.checkpoints.in_use(old.sha256):
                    await self.files.remove(old.sha256)
            await self.files.sweep(self.store.checkpoints.in_use)
        except (OSError, Unavailable) as exc:  # (stored all the same: the next one tidies up)
            log.warning("%s: could not remove old checkpoints: %s", project, exc)
        log.info("%s: stored checkpoint of epoch %d (%.1f MB)", project, info.epoch, info.size / 1e6)
        return True

    def project_summary(self, spec: ProjectSpec) -> ProjectSummary:
        tracker = self.trackers.get(spec.id)
        if tracker is None:  # another process runs it: the figures it left with its lease
            figures = (self.leases.figures(spec.id) if self.leases is not None else None) or \
                LiveFigures(0, 0, 0, 0.0, None)
            figures.epoch = self.store.rounds.collaboration(spec.id)[0]  # (the live figures are seconds old)
            return ProjectSummary(**msgspec.structs.asdict(spec), **msgspec.structs.asdict(figures))
        status = tracker.status()
        return ProjectSummary(**msgspec.structs.asdict(spec), epoch=status.epoch, peers=status.peers,
                              samples=status.samples, samples_per_second=round(status.samples_per_second, 2),
                              eta_seconds=status.eta_seconds)

    async def forward(self, request: web.Request, project: str, socket: bool = False) -> web.StreamResponse:
        """Pass a request for ``project`` on to the process that runs its tracker."""
        lease = self.leases.holder_of(project) if self.leases is not None else None
        if lease is None or self._forwarder is None or lease.url == self.url:
            raise web.HTTPServiceUnavailable(text="the project's coordinator is moving; try again shortly",
                                             headers={"Retry-After": "3"})
        if socket:
            return await forward_socket(request, lease.url, self._forwarder)
        return await forward_request(request, lease.url, self._forwarder)
