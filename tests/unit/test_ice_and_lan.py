"""ICE configuration checks and LAN announcement records, without a network."""

import base64
import hashlib
import hmac

import pytest

from engine.backbone.ice import IceConfig, ice_servers_for, turn_credentials
from engine.lan.records import decode_properties, encode_properties
from engine.transport.backends import native_problem
from engine.transport.backends.aiortc_backend import configuration as aiortc_configuration
from engine.transport.ice import ice_configuration
from engine.wire.ice_servers import IceServer


def test_turn_credentials_follow_coturns_shared_secret_scheme():
    username, password = turn_credentials("s3cret", "peer-9", ttl=600, now=1_000_000)
    assert username == "1000600:peer-9"
    expected = base64.b64encode(hmac.new(b"s3cret", username.encode(), hashlib.sha1).digest()).decode()
    assert password == expected


def test_each_peer_gets_its_own_credentials_and_never_the_secret():
    config = IceConfig(stun_urls=["stun:t.example:3478"], turn_urls=["turn:t.example:3478"],
                       turn_secret="s3cret")
    a, b = ice_servers_for(config, "a"), ice_servers_for(config, "b")
    assert a[0] == IceServer(urls=["stun:t.example:3478"])
    assert a[1].username and a[1].username.endswith(":a")
    assert b[1].username and b[1].username.endswith(":b")
    assert "s3cret" not in repr(a + b)


def test_a_backbone_without_ice_servers_hands_out_an_empty_list_not_aiortcs_default():
    # aiortc falls back to a public STUN server when iceServers is None: on loopback, and
    # wherever an operator runs no STUN, peers must contact nobody else.
    servers = ice_servers_for(IceConfig(), "peer-1")
    assert servers == []
    config = ice_configuration(servers)
    assert config.servers == [] and config.servers is not None
    assert aiortc_configuration(config).iceServers == []  # aiortc's own default is None
    if native_problem() is None:
        from engine.transport.backends.native_backend import configuration as native_configuration

        assert native_configuration(config).ice_servers == []


@pytest.mark.parametrize("config, message", [
    (IceConfig(stun_urls=["http://x"]), "not a STUN URL"),
    (IceConfig(turn_urls=["stun:x"], turn_secret="s"), "not a TURN URL"),
    (IceConfig(turn_urls=["turn:x"]), "shared secret"),
    (IceConfig(relay_only=True), "relay-only needs a TURN server"),
    (IceConfig(turn_urls=["turn:x"], turn_secret="s", turn_ttl=5), "at least 60 seconds"),
])
def test_bad_ice_settings_are_refused_with_a_reason(config, message):
    with pytest.raises(ValueError, match=message):
        config.validate()


def test_announced_projects_round_trip_and_long_titles_are_cut():
    properties = encode_properties({"demo-lm": "Demo LM", "big": "x" * 500})
    raw = {k.encode(): v.encode() for k, v in properties.items()}
    projects = decode_properties(raw)
    assert projects["demo-lm"] == "Demo LM"
    assert 0 < len(projects["big"].encode()) + len("p:big") <= 200


@pytest.mark.parametrize("raw", [
    {b"v": b"2", b"p:x": b"X"},  # a newer format we do not understand
    {b"p:x": b"X"},  # not ours
    {b"v": b"1", b"p:x": b"\xff\xfe"},  # not UTF-8
])
def test_foreign_or_malformed_announcements_are_ignored(raw):
    assert decode_properties(raw) is None
