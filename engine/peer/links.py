"""What a peer knows of its own links: probes against the backbone (now and every
REPROBE_EVERY), the estimate it reports within the volunteer's caps, whether it is a
client (every link leaves through its own TURN relay), and which addresses it offers."""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlparse

from engine.aio import finished_within
from engine.peer.bandwidth import PROBE_SECONDS, REPROBE_EVERY, Bandwidth
from engine.peer.client import BackboneError, ControlClient
from engine.peer.options import PeerOptions
from engine.transport.ice import is_loopback_host
from engine.transport.mesh import PeerMesh
from engine.transport.shaping import RateLimiter

log = logging.getLogger(__name__)
PROBE_TIMEOUT = 30.0  # a probe moves for PROBE_SECONDS; past this the backbone is not answering


async def keep_measured(bandwidth: Bandwidth, client: ControlClient, stop: asyncio.Event) -> None:
    """Probe the link when due, until ``stop``; a probe that fails leaves the last estimate
    and is tried again later."""
    while not stop.is_set():
        if bandwidth.probe_due():
            try:
                upload = await asyncio.wait_for(client.probe_upload(PROBE_SECONDS), PROBE_TIMEOUT)
                download = await asyncio.wait_for(client.probe_download(PROBE_SECONDS), PROBE_TIMEOUT)
                bandwidth.probed(upload, download)
                log.info("link: %.1f Mbit/s up, %.1f Mbit/s down", upload * 8e-6, download * 8e-6)
            except (BackboneError, asyncio.TimeoutError) as exc:
                log.info("could not measure the link: %s", exc or "the backbone stopped answering")
        await finished_within(stop.wait(), REPROBE_EVERY / 10)


def reported_link(bandwidth: Bandwidth, upload: RateLimiter,
                  download: RateLimiter) -> tuple[float | None, float | None]:
    """(upload, download) bytes per second, within the volunteer's caps; None: unmeasured."""
    link = bandwidth.estimate(upload.rate, download.rate)
    return link.upload, link.download


def all_links_relayed(mesh: PeerMesh) -> bool:
    """Client mode, detected: every link that tells leaves through our own TURN relay while
    the other side is reachable without one (a link relayed because the other side is
    behind one does not count: a shaped-links run saw a peer on a slow direct link take
    itself for a client when its first link was to a relay-only peer)."""
    known = [link.relayed_here for link in mesh.open_links().values() if link.relayed_here is not None]
    return bool(known) and all(known)


def offered_addresses(options: PeerOptions) -> list[str] | None:
    """The host addresses to offer (None: all): those asked for, or loopback alone for a
    backbone on this machine."""
    addresses = options.ice_addresses
    if addresses is None and is_loopback_host(urlparse(options.backbone_url).hostname or ""):
        addresses = ["127.0.0.1"]
    return addresses
