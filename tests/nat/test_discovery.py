"""A backbone advertised with mDNS is found from another machine on the LAN and joined."""

from __future__ import annotations

import asyncio
import os

import pytest

from engine.paths import engine_command
from tests.collab.processes import terminate
from tests.nat.services import NAMESPACE_ENV, REPO, spawn_peer_in

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
PROJECT = "tiny-lm"


@pytest.fixture
def advertised(network):
    backbone, url = network.backbone(8474, "--advertise")
    yield url
    backbone.stop()


async def test_discover_lists_the_backbone_and_its_projects(network, advertised):
    process = await asyncio.create_subprocess_exec(
        *network.host.prefix(), *engine_command(), "peer", "--discover",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO,
        env={**os.environ, **NAMESPACE_ENV},
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    listing = out.decode()
    assert advertised in listing, listing
    assert "tiny-lm: Tiny LM" in listing, listing


async def test_peers_join_a_discovered_backbone_and_connect_over_the_lan(network, advertised, tmp_path):
    peers = [await spawn_peer_in(host, None, PROJECT, name, tmp_path, "--max-epochs", "8")
             for name, host in (("first", network.host), ("second", network.lan_host))]
    try:
        for peer in peers:
            await peer.reached(8, 120)
        shared = [e for e in peers[0].epochs if e["peers"] == 2]
        assert shared, "the two peers never averaged together"
        for peer in peers:
            # Both ends know the backbone's TURN server, yet a LAN needs no relay.
            assert all(path == "host" for e in peer.epochs for path in e["paths"].values()), peer.epochs
        assert peers[0].epochs[-1]["state_sha256"] == peers[1].epochs[-1]["state_sha256"]
    finally:
        await terminate(*peers)
