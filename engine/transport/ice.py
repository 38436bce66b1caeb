"""ICE configuration: the servers a backbone hands out, and which local addresses to offer."""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

import aioice.ice
import aioice.turn
from aiortc import RTCConfiguration, RTCIceServer, RTCIceTransportPolicy

log = logging.getLogger(__name__)
# aioice asks for 256 KiB UDP receive buffers, but one SCTP association keeps up to 1 MiB
# in flight: a burst overflowed the buffer, and each dropped tail packet cost a 1 s
# retransmission timeout (on loopback: ~100 drops and 1.2 s round stalls per half minute of
# training; none at 2 MiB). Linux caps it at net.core.rmem_max (4 MiB on stock kernels).
UDP_RECEIVE_BUFFER = 2 * 1024 * 1024

_discover_host_addresses = aioice.ice.get_host_addresses
_allowed: list[str] = []


def ice_configuration(servers: list[dict[str, Any]], relay_only: bool = False) -> RTCConfiguration:
    """Build an RTCConfiguration from the backbone's list; never aiortc's public default."""
    ice = [
        RTCIceServer(urls=s["urls"], username=s.get("username"), credential=s.get("credential"))
        for s in servers
        if isinstance(s, dict) and isinstance(s.get("urls"), (str, list))
    ]
    policy = RTCIceTransportPolicy.RELAY if relay_only else RTCIceTransportPolicy.ALL
    return RTCConfiguration(iceServers=ice, iceTransportPolicy=policy)


def enlarge_udp_buffers() -> None:
    """Give the UDP sockets ICE opens from now on (host and TURN) room for a full SCTP window."""
    aioice.turn.UDP_SOCKET_BUFFER_SIZE = max(aioice.turn.UDP_SOCKET_BUFFER_SIZE, UDP_RECEIVE_BUFFER)


def restrict_host_addresses(addresses: list[str] | None) -> None:
    """Offer only ``addresses`` as host candidates (None: every interface, aioice's default).

    aioice has no option for this and never offers 127.0.0.1, so a collaboration whose
    peers all live on one machine could not connect over loopback, and a user could not
    keep ICE off an interface (a VPN, say). The choice is process-wide, like a peer.
    """
    global _allowed
    for address in addresses or []:
        ipaddress.ip_address(address)
    _allowed = list(addresses or [])
    aioice.ice.get_host_addresses = _allowed_host_addresses if _allowed else _discover_host_addresses
    if _allowed:
        log.info("ICE host candidates restricted to %s", ", ".join(_allowed))


def _allowed_host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    return [
        a for a in _allowed
        if (ipaddress.ip_address(a).version == 4 and use_ipv4)
        or (ipaddress.ip_address(a).version == 6 and use_ipv6)
    ]


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
