"""Every change Cotrain makes to aioice, and every private part of aioice and aiortc it reads
(the aiortc backend's; the native stack needs none of them).

Neither library has an API for these (why each exists is in its docstring), so each one
depends on their internals. ``apply()`` first checks that everything it patches or reads is
still there with the shape it expects, and refuses to start otherwise -- naming what moved --
rather than misbehave mid-round; pyproject.toml caps both libraries at the versions checked.

1. UDP receive buffers (``aioice.turn.UDP_SOCKET_BUFFER_SIZE``): room for a full SCTP window.
2. Patient consent checks (``aioice.ice.Connection.query_consent``): RFC 7675's 30 s.
3. Host candidates (``aioice.ice.get_host_addresses``): loopback, or the interfaces a user picks.
4. The nominated candidate pair (``RTCIceTransport._connection._nominated``): how a link connects.
"""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import logging
import random
from importlib.metadata import version
from typing import Any

import aioice.ice
import aioice.stun
import aioice.turn
from aiortc import RTCIceGatherer, RTCIceTransport, RTCPeerConnection

from engine.transport.connection import SelectedPair

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
_applied = False


class IncompatibleNetworkStack(RuntimeError):
    """aioice or aiortc changed in a way Cotrain's patches do not know."""


def _parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


def problems() -> list[str]:
    """What no longer looks the way the patches expect (empty: all is well)."""
    found: list[str] = []

    def expect(ok: bool, what: str) -> None:
        if not ok:
            found.append(what)

    connection = aioice.ice.Connection
    expect(isinstance(getattr(aioice.turn, "UDP_SOCKET_BUFFER_SIZE", None), int),
           "aioice.turn.UDP_SOCKET_BUFFER_SIZE is no longer an int")
    expect(inspect.iscoroutinefunction(getattr(connection, "query_consent", None))
           and _parameters(connection.query_consent) == ["self"],
           "aioice.ice.Connection.query_consent(self) is gone or takes other arguments")
    expect({"pair", "nominate"} <= set(_parameters(getattr(connection, "build_request", lambda: None))),
           "aioice.ice.Connection.build_request(pair, nominate) changed")
    expect({"integrity_key", "retransmissions"} <= set(_parameters(aioice.ice.StunProtocol.request)),
           "aioice.ice.StunProtocol.request takes no integrity_key or retransmissions")
    expect(isinstance(getattr(aioice.ice, "CONSENT_INTERVAL", None), (int, float))
           and isinstance(getattr(aioice.stun, "RETRY_RTO", None), (int, float)),
           "aioice's CONSENT_INTERVAL or RETRY_RTO is gone")
    expect(isinstance(getattr(aioice.stun, "TransactionError", None), type),
           "aioice.stun.TransactionError is gone")
    expect(_parameters(getattr(aioice.ice, "get_host_addresses", lambda: None)) == ["use_ipv4", "use_ipv6"],
           "aioice.ice.get_host_addresses(use_ipv4, use_ipv6) changed")
    expect(all(isinstance(getattr(aioice.ice.CandidatePair, name, None), property)
               for name in ("local_candidate", "remote_addr")),
           "aioice.ice.CandidatePair has no local_candidate or remote_addr")
    ice = RTCIceTransport(RTCIceGatherer([]))
    inner = getattr(ice, "_connection", None)
    expect(isinstance(inner, connection), "aiortc's RTCIceTransport has no aioice Connection in _connection")
    expect(all(hasattr(inner, name) for name in ("_nominated", "remote_password", "_query_consent_task")),
           "aioice.ice.Connection lost _nominated, remote_password or _query_consent_task")
    expect(isinstance(getattr(RTCPeerConnection, "sctp", None), property),
           "aiortc's RTCPeerConnection.sctp is gone")
    return found


def apply() -> None:
    """Check, then patch (once per process); raises IncompatibleNetworkStack naming what moved."""
    global _applied
    if _applied:
        return
    found = problems()
    if found:
        raise IncompatibleNetworkStack(
            f"aioice {version('aioice')} / aiortc {version('aiortc')} changed what Cotrain relies on: "
            + "; ".join(found) + ". Install the versions pyproject.toml allows.")
    aioice.turn.UDP_SOCKET_BUFFER_SIZE = max(aioice.turn.UDP_SOCKET_BUFFER_SIZE, UDP_RECEIVE_BUFFER)
    aioice.ice.Connection.query_consent = _query_consent  # type: ignore[method-assign]
    _applied = True


async def _query_consent(self: aioice.ice.Connection) -> None:
    while True:
        await asyncio.sleep(aioice.ice.CONSENT_INTERVAL * random.uniform(0.8, 1.2))
        for pair in list(self._nominated.values()):
            request = self.build_request(pair, nominate=False)
            try:
                await pair.protocol.request(request, pair.remote_addr,
                                            integrity_key=(self.remote_password or "").encode("utf8"),
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


def nominated_pair(pc: RTCPeerConnection) -> SelectedPair | None:
    """The nominated candidate pair's types (None before ICE completes): the pair sits on
    aioice's connection, inside aiortc's SCTP -> DTLS -> ICE transport chain."""
    try:
        connection = pc.sctp.transport.transport._connection  # type: ignore[union-attr]
        pair = connection._nominated.get(1)
    except AttributeError:
        return None
    if pair is None:
        return None
    return SelectedPair(pair.local_candidate.type, pair.remote_candidate.type)
