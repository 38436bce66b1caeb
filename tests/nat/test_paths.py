"""Which path ICE finds between peers behind real NATs, and how fast it gives up."""

from __future__ import annotations

import pytest

from tests.nat.services import run_probes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
PROJECT = "tiny-lm"


@pytest.fixture(scope="module")
def stun_only(network):
    backbone, url = network.backbone(8471, turn=False)
    yield url
    backbone.stop()


@pytest.fixture(scope="module")
def with_turn(network):
    backbone, url = network.backbone(8472)
    yield url
    backbone.stop()


def assert_connected(a: dict, b: dict, path: str) -> None:
    assert a["ok"] and b["ok"], (a, b)
    assert a["path"] == b["path"] == path, (a, b)


async def test_two_cone_nats_connect_directly_with_stun(network, stun_only):
    a, b = await run_probes(network.cone, network.cone2, stun_only, PROJECT, network.workdir)
    assert_connected(a, b, "srflx")


async def test_symmetric_nat_with_stun_only_fails_within_the_connect_timeout(network, stun_only):
    a, b = await run_probes(network.cone, network.symmetric, stun_only, PROJECT, network.workdir,
                            "--connect-timeout", "8")
    for report in (a, b):
        assert not report["ok"], report
        assert "could not connect" in report["error"], report
        assert report["after_seconds"] < 8 + 3, report


async def test_symmetric_nat_connects_through_turn(network, with_turn):
    a, b = await run_probes(network.cone, network.symmetric, with_turn, PROJECT, network.workdir)
    assert_connected(a, b, "relay")
    # The relay is the symmetric side's need, never the cone's (client mode, if anyone's).
    assert a["relayed_here"] is not True and b["relayed_here"] is not False, (a, b)


async def test_relay_only_policy_relays_even_between_public_hosts(network, with_turn):
    a, b = await run_probes(network.host, network.cone, with_turn, PROJECT, network.workdir, "--relay-only")
    assert_connected(a, b, "relay")


async def test_only_the_peer_behind_the_relay_takes_itself_for_a_client(network, with_turn):
    """A relay-only peer and a public host: their link is relayed, because of the first.
    The public host must not conclude that others cannot reach it (client mode: it would
    reduce nothing), whether ICE paired the relay with its host candidate or, as it may,
    with its own relay; the relay-only peer knows what it is from its own setting."""
    a, b = await run_probes(network.host, network.lan_host, with_turn, PROJECT, network.workdir,
                            a_args=("--relay-only",))
    assert_connected(a, b, "relay")
    assert b["relayed_here"] is not True and a["relayed_here"] is not False, (a, b)



async def test_a_backbone_with_a_relay_only_policy_sends_every_peer_through_turn(network):
    backbone, url = network.backbone(8474, "--relay-only")
    try:
        # Two hosts on one LAN, which would otherwise connect host to host; no flag on the peers.
        a, b = await run_probes(network.host, network.lan_host, url, PROJECT, network.workdir)
    finally:
        backbone.stop()
    assert_connected(a, b, "relay")


async def test_peers_on_one_lan_connect_over_host_candidates_not_turn(network, with_turn):
    a, b = await run_probes(network.host, network.lan_host, with_turn, PROJECT, network.workdir)
    assert_connected(a, b, "host")
