"""Address groups: what the backbone's per-address limits count as one address.

An IPv4 address is one machine, or one NAT. An IPv6 host is usually handed a whole /64 and
can pick any of its 2^64 addresses for each connection, so limits keyed by the full address
would let one host act as that many strangers: IPv6 counts by its prefix (/64 unless the
owner says otherwise). An IPv4 address written as IPv6 (``::ffff:a.b.c.d``, from a
dual-stack socket) is the IPv4 address.
"""

from __future__ import annotations

import ipaddress

DEFAULT_IPV6_PREFIX = 64


def plain_address(address: str) -> str:
    """``address`` written one way: without an IPv6 zone, IPv4-mapped IPv6 as IPv4; a text
    that is no address (a Unix socket, "unknown") is returned as it is."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def address_group(address: str, ipv6_prefix: int) -> str:
    """The key per-address limits count ``address`` under: an IPv4 address itself, an IPv6
    address's network of ``ipv6_prefix`` bits (``2001:db8:1:2::/64``). A group maps to itself;
    a text that is neither an address nor a network is its own group."""
    if not 0 <= ipv6_prefix <= 128:
        raise ValueError(f"an IPv6 prefix is 0 to 128 bits, not {ipv6_prefix}")
    plain = plain_address(address)
    try:
        network = ipaddress.ip_network(plain, strict=False)
    except ValueError:
        return plain
    if network.version == 4:
        return str(network.network_address) if network.prefixlen == 32 else str(network)
    if network.prefixlen > ipv6_prefix:
        network = network.supernet(new_prefix=ipv6_prefix)
    return str(network)
