"""ICE configuration: the servers a backbone hands out, as aiortc takes them."""

from __future__ import annotations

import ipaddress

from aiortc import RTCConfiguration, RTCIceServer, RTCIceTransportPolicy

from engine.wire.control import IceServer


def ice_configuration(servers: list[IceServer], relay_only: bool = False) -> RTCConfiguration:
    """Build an RTCConfiguration from the backbone's list; never aiortc's public default."""
    ice = [RTCIceServer(urls=s.urls, username=s.username, credential=s.credential) for s in servers]
    policy = RTCIceTransportPolicy.RELAY if relay_only else RTCIceTransportPolicy.ALL
    return RTCConfiguration(iceServers=ice, iceTransportPolicy=policy)


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
