"""ICE configuration: the servers a backbone hands out, and which local addresses to offer."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
from typing import Any

import aioice.ice
import aioice.stun
import aioice.turn
from aiortc import RTCConfiguration, RTCIceServer, RTCIceTransportPolicy

log = logging.getLogger(__name__)
# aioice asks for 256 KiB UDP receive buffers, but one SCTP association keeps up to 1 MiB
# in flight: a burst overflowed the buffer, and each dropped tail packet cost a 1 s
# retransmission timeout (on loopback: ~100 drops and 1.2 s round stalls per half minute of
# training; none at 2 MiB). Linux caps it at net.core.rmem_max (4 MiB on stock kernels).
UDP_RECEIVE_BUFFER = 2 * 1024 * 1024
# RFC 7675 consent freshness: a check every ~5 s, consent lost after ~30 s without an answer.
# aioice gives each check 0.5 s and no retransmission, and drops the connection after six
# checks in a row fail. A peer busy averaging (up to that 1 MiB of SCTP data queued ahead of
# each STUN answer, on a machine whose user needs the processor) answers later than 0.5 s for
# minutes: its links died mid-round with "Consent to send expired". Here a check is retried
# as STUN retries (0.5, 1, 2 ... s) and any late answer renews consent; consent is lost only
# when a check gets no answer for CONSENT_TIMEOUT seconds.
CONSENT_RETRANSMISSIONS = 5  # sends at 0, 0.5, 1.5, 3.5, 7.5, 15.5 s, gives up at 31.5 s
CONSENT_TIMEOUT = aioice.stun.RETRY_RTO * (2 ** (CONSENT_RETRANSMISSIONS + 1) - 1)

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


def tolerate_late_consent() -> None:
    """Use ``_query_consent`` for ICE connections made from now on (process-wide)."""
    if getattr(aioice.ice.Connection, "query_consent", None) is not _query_consent:
        aioice.ice.Connection.query_consent = _query_consent


async def _query_consent(self: aioice.ice.Connection) -> None:
    while True:
        await asyncio.sleep(aioice.ice.CONSENT_INTERVAL * random.uniform(0.8, 1.2))
        for pair in list(self._nominated.values()):
            request = self.build_request(pair, nominate=False)
            try:
                await pair.protocol.request(request, pair.remote_addr,
                                            integrity_key=self.remote_password.encode("utf8"),
                                            retransmissions=CONSENT_RETRANSMISSIONS)
            except aioice.stun.TransactionError:
                log.info("ICE consent expired: %s did not answer for %.0f s", pair.remote_addr,
                         CONSENT_TIMEOUT)
                self._query_consent_task = None
                await self.close()
                return


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
