"""Listing the backbones that advertise themselves on the LAN."""

from __future__ import annotations

import asyncio
import logging
import os

from zeroconf import InterfaceChoice, IPVersion, ServiceStateChange
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from engine.lan.records import SERVICE_TYPE, LanBackbone, decode_properties

log = logging.getLogger(__name__)


def default_interfaces() -> list[str] | InterfaceChoice:
    """Every interface, unless COTRAIN_LAN_INTERFACES lists addresses (comma-separated) to
    browse on: to keep discovery off a VPN, or (in tests) on loopback."""
    chosen = [a.strip() for a in os.environ.get("COTRAIN_LAN_INTERFACES", "").split(",") if a.strip()]
    return chosen or InterfaceChoice.All


async def discover(seconds: float = 3.0, interfaces: list[str] | None = None) -> list[LanBackbone]:
    """Backbones that answer within ``seconds``, by name; malformed announcements are skipped."""
    zeroconf = AsyncZeroconf(interfaces=interfaces or default_interfaces(), ip_version=IPVersion.V4Only)
    names: set[str] = set()

    def on_change(zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        if state_change is not ServiceStateChange.Removed:
            names.add(name)

    browser = AsyncServiceBrowser(zeroconf.zeroconf, SERVICE_TYPE, handlers=[on_change])
    try:
        await asyncio.sleep(seconds)  # DNS-SD answers arrive over this window; it is the protocol
        found = []
        for name in sorted(names):
            info = AsyncServiceInfo(SERVICE_TYPE, name)
            if not await info.async_request(zeroconf.zeroconf, 1500):
                continue
            backbone = _to_backbone(info)
            if backbone is not None:
                found.append(backbone)
        return found
    finally:
        await browser.async_cancel()
        await zeroconf.async_close()


def _to_backbone(info: AsyncServiceInfo) -> LanBackbone | None:
    projects = decode_properties(info.properties or {})
    addresses = info.parsed_addresses(IPVersion.V4Only)
    if projects is None or not addresses or not info.port:
        log.debug("ignoring %s: not a Cotrain backbone we understand", info.name)
        return None
    label = info.name.removesuffix(f".{SERVICE_TYPE}")
    return LanBackbone(name=label, url=f"http://{addresses[0]}:{info.port}", projects=projects)
