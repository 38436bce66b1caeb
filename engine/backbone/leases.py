"""Several backbone processes on one database: each project's tracker runs in the one
process that holds the project's lease (engine/backbone/store/lease_records.py); the others serve
what the database holds and forward the rest to the holder (engine/backbone/forwarding.py).

Every RENEW_EVERY seconds each process renews the leases it holds and tries to take the
others: one taken from an expired holder (killed, or cut off) starts its tracker from the
settled record, as a restarted backbone does -- the round in flight is settled by what its
members replay, or redone. A process that could not renew for LEASE_SECONDS stops its
trackers before anyone may take them over, so two never run one project."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import TYPE_CHECKING

import msgspec

from engine.backbone.store.database import Unavailable
from engine.backbone.store.lease_records import Lease
from engine.wire.rest import ProjectSummary

if TYPE_CHECKING:
    from engine.backbone.server import Backbone

log = logging.getLogger(__name__)
LEASE_SECONDS = 9.0  # a dead holder's projects are taken over within this and one RENEW_EVERY
RENEW_EVERY = 3.0


class LiveFigures(msgspec.Struct):
    """A project's live figures, as its holder leaves them for the other processes."""

    epoch: int
    peers: int
    samples: int
    samples_per_second: float
    eta_seconds: float | None


class LeaseKeeper:
    def __init__(self, backbone: Backbone) -> None:
        self.backbone = backbone
        self.holder = secrets.token_hex(8)  # this process, for as long as it runs
        self.renewed: dict[str, float] = {}  # project -> when we last renewed it (monotonic)
        self.others: dict[str, Lease | None] = {}  # project -> its holder, as last read
        self.started = 0  # trackers this process started, on taking a lease

    @property
    def url(self) -> str:
        return self.backbone.config.internal_url or self.backbone.url

    def holder_of(self, project: str) -> Lease | None:
        """Who runs ``project``'s tracker if we do not (None: nobody now)."""
        return self.others.get(project)

    def figures(self, project: str) -> LiveFigures | None:
        lease = self.others.get(project)
        if lease is None or not lease.status:
            return None
        try:
            return msgspec.json.decode(lease.status, type=LiveFigures)
        except msgspec.DecodeError:
            return None

    async def run(self) -> None:
        while True:
            self.renew()
            await asyncio.sleep(RENEW_EVERY)

    def renew(self) -> None:
        backbone, leases = self.backbone, self.backbone.store.leases
        now = time.monotonic()
        for project in list(backbone.projects):
            held = project in backbone.trackers
            status = self._status(project) if held else ""
            try:
                ours = leases.take(project, self.holder, self.url, LEASE_SECONDS, status)
                self.others[project] = None if ours else leases.holder(project)
            except Unavailable as exc:  # keep what we hold while it is still ours
                log.warning("%s: could not renew the lease: %s", project, exc)
                if held and now - self.renewed.get(project, now) >= LEASE_SECONDS - RENEW_EVERY:
                    backbone.stop_tracker(project, "this process lost the database")
                continue
            if ours:
                self.renewed[project] = now
                if not held:
                    log.warning("%s: this process (%s) runs the project's tracker now", project, self.holder)
                    self.started += 1
                    backbone.start_tracker(project)
            elif held:
                backbone.stop_tracker(project, "another process holds the project")

    def _status(self, project: str) -> str:
        summary: ProjectSummary = self.backbone.project_summary(self.backbone.projects[project])
        figures = LiveFigures(summary.epoch, summary.peers, summary.samples, summary.samples_per_second,
                              summary.eta_seconds)
        return msgspec.json.encode(figures).decode()

    def release(self) -> None:
        """On a clean stop: let another process take our projects at once."""
        for project in list(self.renewed):
            try:
                self.backbone.store.leases.release(project, self.holder)
            except Unavailable as exc:
                log.warning("%s: could not give the lease up: %s", project, exc)
