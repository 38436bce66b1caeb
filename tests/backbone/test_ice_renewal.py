"""TURN credentials expire: a peer that stays for days keeps getting fresh ones."""

import time

import pytest

from engine.backbone.ice import IceConfig
from tests.collab.harness import running_backbone, start_peer, stop_all, tiny_project
from tests.conftest import until

pytestmark = pytest.mark.slow
TTL = 600


def turn_expiry(peer) -> int | None:
    """When the TURN credential the peer would use for its next link expires."""
    for server in peer.peer.mesh.config.servers:
        if server.username:
            return int(server.username.split(":", 1)[0])
    return None


async def test_a_long_running_peer_gets_fresh_turn_credentials_before_they_expire(tmp_path):
    ice = IceConfig(turn_urls=["turn:127.0.0.1:3478"], turn_secret="s3cret", turn_ttl=TTL)
    project = tiny_project()
    async with running_backbone(tmp_path, project, ice=ice) as backbone:
        peer = start_peer(backbone.url, project.id, "stayer")
        try:
            await until(lambda: peer.peer.joined and turn_expiry(peer), 30, "the peer to join")
            first = turn_expiry(peer)
            assert abs(first - (time.time() + TTL)) < 30
            backbone.renew_ice_credentials(time.time() + TTL / 2 - 5)  # not due yet
            backbone.renew_ice_credentials(time.time() + TTL / 2 + 1)  # half its life later
            await until(lambda: turn_expiry(peer) != first, 10, "fresh credentials to arrive")
            assert turn_expiry(peer) >= first + TTL / 2
            assert all(server.credential for server in peer.peer.mesh.config.servers)
        finally:
            await stop_all(peer)
