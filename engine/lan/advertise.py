"""A backbone announcing itself on the LAN, so apps nearby list it with no configuration."""

from __future__ import annotations

import ipaddress
import logging
import socket

import ifaddr
from zeroconf import IPVersion
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

from engine.lan.records import SERVICE_TYPE, encode_properties

log = logging.getLogger(__name__)


def lan_addresses(bind_host: str) -> list[str]:
    """The IPv4 addresses a backbone bound to ``bind_host`` is reachable at."""
    if bind_host not in ("0.0.0.0", ""):
        return [bind_host]
    found = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str) and not ipaddress.ip_address(ip.ip).is_loopback:
                found.append(ip.ip)
    return found


class Advertiser:
    def __init__(self, bind_host: str, port: int, projects: dict[str, str]) -> None:
        self.addresses = lan_addresses(bind_host)
        if not self.addresses:
            raise ValueError("no network address to advertise the backbone on")
        self._zeroconf = AsyncZeroconf(interfaces=self.addresses, ip_version=IPVersion.V4Only)
        label = f"Cotrain backbone on {socket.gethostname()} port {port}"[:63]
        self.info = AsyncServiceInfo(
            SERVICE_TYPE, f"{label}.{SERVICE_TYPE}", port=port,
            properties=encode_properties(projects), parsed_addresses=self.addresses,
            server=f"{socket.gethostname()}.local.",
        )

    async def start(self) -> None:
        await self._zeroconf.async_register_service(self.info, allow_name_change=True)
        log.info("advertised on the LAN as %r at %s", self.info.name, ", ".join(self.addresses))

    async def stop(self) -> None:
        await self._zeroconf.async_unregister_service(self.info)
        await self._zeroconf.async_close()
