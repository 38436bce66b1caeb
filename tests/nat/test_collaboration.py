"""A collaboration across a public host, a cone NAT and a symmetric NAT, and a TURN outage."""

from __future__ import annotations

import itertools
import time

import pytest

from tests.collab.processes import terminate
from tests.conftest import until
from tests.nat.network import ROUND_TIMEOUT
from tests.nat.services import spawn_peer_in

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]
PROJECT = "tiny-lm"


def kinds(epoch_line: dict) -> list[str]:
    return sorted(p or "unknown" for p in epoch_line["paths"].values())


def assert_same_parameters(peers) -> list[int]:
    hashes = [{e["epoch"]: e["state_sha256"] for e in p.epochs} for p in peers]
    common = sorted(set.intersection(*(set(h) for h in hashes)))
    for epoch in common:
        assert len({h[epoch] for h in hashes}) == 1, f"parameters differ after epoch {epoch}"
    return common


async def test_peers_behind_cone_and_symmetric_nats_train_together_and_survive_a_turn_outage(
        network, tmp_path):
    backbone, url = network.backbone(8473)
    hosts = {"public": network.host, "cone": network.cone, "symmetric": network.symmetric}
    peers = {name: await spawn_peer_in(host, url, PROJECT, name, tmp_path) for name, host in hosts.items()}
    public, cone, symmetric = peers["public"], peers["cone"], peers["symmetric"]
    try:
        def full_epochs(peer) -> list[dict]:
            return [e for e in peer.epochs if e["peers"] == 3]

        await until(lambda: all(len(full_epochs(p)) >= 3 for p in peers.values()), 180,
                    "three epochs in which all three peers took part")
        assert len(assert_same_parameters(peers.values())) >= 3
        # The public peer reaches both NATed peers directly; the two NATs need the relay.
        assert kinds(full_epochs(public)[-1]) == ["srflx", "srflx"]
        assert kinds(full_epochs(cone)[-1]) == ["relay", "srflx"]
        assert kinds(full_epochs(symmetric)[-1]) == ["relay", "srflx"]

        network.coturn.kill()
        outage, epochs_before = time.monotonic(), len(public.epochs)
        await until(lambda: len(public.epochs) >= epochs_before + 4, 150,
                    "the public peer to go on through the TURN outage")
        after = [t for t in public.arrivals if t > outage]
        gaps = [b - a for a, b in itertools.pairwise([outage, *after])]
        # A stalled round costs its timeout (and the backbone's 5 s grace before it closes
        # the round), then the unreachable pair is kept apart; nothing else waits on it.
        assert max(gaps) < ROUND_TIMEOUT + 5 + 4, gaps
        assert any(e["peers"] == 2 for e in public.epochs[epochs_before:]), "nobody was left out"

        network.start_coturn()
        back = len(public.epochs)
        await until(lambda: any(e["peers"] == 3 for e in public.epochs[back:]), 150,
                    "all three peers in one round again once coturn is back")
        await until(lambda: all(p.epochs and p.epochs[-1]["epoch"] >= public.epochs[-1]["epoch"]
                                for p in (cone, symmetric)), 60, "every peer to catch up")
        assert_same_parameters(peers.values())
    finally:
        await terminate(*peers.values())
        backbone.stop()
        if network.coturn.process.poll() is not None:
            network.start_coturn()


async def test_a_peer_whose_nat_rebinds_reconnects_and_nobody_waits_beyond_a_round(network, tmp_path):
    backbone, url = network.backbone(8475)
    hosts = {"public": network.host, "neighbour": network.lan_host, "cone": network.cone}
    peers = {name: await spawn_peer_in(host, url, PROJECT, name, tmp_path) for name, host in hosts.items()}
    public, cone = peers["public"], peers["cone"]
    try:
        await until(lambda: all(sum(e["peers"] == 3 for e in p.epochs) >= 2 for p in peers.values()), 180,
                    "two epochs in which all three peers took part")
        network.topology.rebind(network.cone)  # the cone peer's public address changes under it
        rebound, before = time.monotonic(), len(public.epochs)
        await until(lambda: any(e["peers"] == 3 for e in public.epochs[before + 1:]), 180,
                    "the rebound peer in a round with everyone again")
        after = [t for t in public.arrivals if t > rebound]
        gaps = [b - a for a, b in itertools.pairwise([rebound, *after])]
        assert max(gaps) < ROUND_TIMEOUT + 5 + 4, gaps
        await until(lambda: cone.epochs and cone.epochs[-1]["epoch"] >= public.epochs[-1]["epoch"], 60,
                    "the rebound peer to catch up")
        assert assert_same_parameters(peers.values())
        # It really did talk to the others through new mappings of its router.
        assert any(40000 <= port <= 49999 for port in network.topology.public_ports(network.cone))
    finally:
        await terminate(*peers.values())
        backbone.stop()
