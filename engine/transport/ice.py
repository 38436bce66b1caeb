"""ICE configuration: the servers a backbone hands out and the relay policy, for any stack."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from engine.wire.ice_servers import IceServer


@dataclass(frozen=True)
class IceSettings:
    """What every backend builds its own configuration from. ``servers`` is never None: a
    stack's public default STUN server would contact strangers from a loopback test."""

    servers: list[IceServer] = field(default_factory=list)
    relay_only: bool = False


def ice_configuration(servers: list[IceServer], relay_only: bool = False) -> IceSettings:
    return IceSettings(list(servers), relay_only)


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
