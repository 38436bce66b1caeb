"""Home routers in network namespaces: a public segment, NATs with stateful firewalls, peers.

The public segment is a bridge on 100.64.0.0/24 (the shared address range, so nothing here
collides with a real network). Its namespace hosts the backbone and coturn. Each router
namespace joins the bridge on its WAN side and masquerades a private /24 behind it:
plain MASQUERADE keeps source ports (a "cone" NAT, as most home routers behave);
``--random-fully`` picks a new port per destination (a symmetric NAT, as some carrier NATs
do). Every router drops unsolicited inbound traffic, as real ones do; without that even the
cone case misbehaves, because a stray packet accepted early claims the WAN port.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field

PUBLIC_PREFIX = "100.64.0"
FAKE_GATEWAY = f"{PUBLIC_PREFIX}.254"  # a default route into nowhere, as the internet is to us


def missing_requirements() -> str | None:
    """Why NAT tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces (CI runs as root)"
    for tool in ("ip", "tc", "iptables", "turnserver", "conntrack"):
        if shutil.which(tool) is None:
            return f"needs {tool} (apt-get install iproute2 iptables coturn conntrack)"
    probe = f"ctprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create network namespaces here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def sh(*args: str) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


@dataclass
class Host:
    """A namespace that runs programs; ``address`` is the one it is reached at."""

    namespace: str
    address: str

    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace]

    def run(self, *args: str) -> str:
        return sh(*self.prefix(), *args)


@dataclass
class Topology:
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    namespaces: list[str] = field(default_factory=list)
    routers: dict[str, str] = field(default_factory=dict)  # machine namespace -> its router's
    _next_public: int = 10
    _next_lan: int = 1

    def __post_init__(self) -> None:
        self.public = self._namespace("pub")
        self.public_host = Host(self.public, f"{PUBLIC_PREFIX}.1")
        self._ns(self.public, "ip", "link", "add", "br0", "type", "bridge")
        self._ns(self.public, "ip", "addr", "add", f"{PUBLIC_PREFIX}.1/24", "dev", "br0")
        self._ns(self.public, "ip", "link", "set", "br0", "up")
        self._blackhole_default(self.public, "br0")

    def _namespace(self, role: str) -> str:
        name = f"ct{self.tag}{role}"
        sh("ip", "netns", "add", name)
        self.namespaces.append(name)
        self._ns(name, "ip", "link", "set", "lo", "up")
        return name

    def _ns(self, namespace: str, *args: str) -> str:
        return sh("ip", "netns", "exec", namespace, *args)

    def _blackhole_default(self, namespace: str, device: str) -> None:
        # Traffic for unknown addresses vanishes silently, as on the internet, instead of
        # an immediate "unreachable" that makes coturn drop allocations.
        self._ns(namespace, "ip", "neigh", "add", FAKE_GATEWAY, "lladdr", "02:00:00:00:00:fe",
                 "dev", device, "nud", "permanent")
        self._ns(namespace, "ip", "route", "add", "default", "via", FAKE_GATEWAY)

    def _plug_into_bridge(self, namespace: str, device: str) -> tuple[str, str]:
        """A veth from ``namespace`` (named ``device``) into the public bridge; returns its
        address and the name of the veth's bridge end."""
        address = f"{PUBLIC_PREFIX}.{self._next_public}"
        self._next_public += 1
        outside = f"ct{self.tag}b{self._next_public}"
        sh("ip", "link", "add", outside, "type", "veth", "peer", "name", device, "netns", namespace)
        sh("ip", "link", "set", outside, "netns", self.public)
        self._ns(self.public, "ip", "link", "set", outside, "master", "br0", "up")
        self._ns(namespace, "ip", "addr", "add", f"{address}/24", "dev", device)
        self._ns(namespace, "ip", "link", "set", device, "up")
        return address, outside

    def public_peer(self, upload_mbit: float | None = None, download_mbit: float | None = None) -> Host:
        """A machine with a public address on the segment (a university box, a VPS), its
        link shaped to these rates if given (a token bucket on each end of its cable, with
        a queue as deep as a home router's)."""
        name = self._namespace(f"h{self._next_public}")
        address, outside = self._plug_into_bridge(name, "eth0")
        self._blackhole_default(name, "eth0")
        for namespace, device, rate in ((name, "eth0", upload_mbit), (self.public, outside, download_mbit)):
            if rate is not None:
                self._ns(namespace, "tc", "qdisc", "add", "dev", device, "root", "tbf", "rate", f"{rate}mbit",
                         "burst", "32kb", "latency", "400ms")
        return Host(name, address)

    def behind_nat(self, symmetric: bool) -> Host:
        """A home machine behind its own router; returns the machine (its private address)."""
        lan = self._next_lan
        self._next_lan += 1
        router = self._namespace(f"r{lan}")
        self._plug_into_bridge(router, "wan")
        self._ns(router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        masquerade = ["iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "wan", "-j", "MASQUERADE"]
        self._ns(router, *masquerade, *(["--random-fully"] if symmetric else []))
        for chain in ("INPUT", "FORWARD"):
            self._ns(router, "iptables", "-A", chain, "-i", "wan", "-m", "conntrack",
                     "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
            self._ns(router, "iptables", "-A", chain, "-i", "wan", "-j", "DROP")
        self._ns(router, "ip", "route", "add", "default", "via", FAKE_GATEWAY, "onlink", "dev", "wan")
        self._ns(router, "ip", "neigh", "replace", FAKE_GATEWAY, "lladdr", "02:00:00:00:00:fe",
                 "dev", "wan", "nud", "permanent")
        machine = self._namespace(f"n{lan}")
        outside = f"ct{self.tag}l{lan}"
        sh("ip", "link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", machine)
        sh("ip", "link", "set", outside, "netns", router)
        self._ns(router, "ip", "addr", "add", f"10.0.{lan}.1/24", "dev", outside)
        self._ns(router, "ip", "link", "set", outside, "up")
        self._ns(machine, "ip", "addr", "add", f"10.0.{lan}.2/24", "dev", "eth0")
        self._ns(machine, "ip", "link", "set", "eth0", "up")
        self._ns(machine, "ip", "route", "add", "default", "via", f"10.0.{lan}.1")
        self.routers[machine] = router
        return Host(machine, f"10.0.{lan}.2")

    def rebind(self, machine: Host) -> None:
        """The router in front of ``machine`` forgets its mappings and makes new ones on other
        ports, as a home router does after a reboot or when its table overflows: the peer's
        address as the internet sees it changes under its open connections."""
        router = self.routers[machine.namespace]
        self._ns(router, "iptables", "-t", "nat", "-I", "POSTROUTING", "1", "-o", "wan", "-p", "udp",
                 "-j", "MASQUERADE", "--to-ports", "40000-49999", "--random")
        self._ns(router, "conntrack", "-F")

    def public_ports(self, machine: Host) -> set[int]:
        """The UDP ports ``machine``'s router shows the internet for it now."""
        listing = self._ns(self.routers[machine.namespace], "conntrack", "-L", "-p", "udp")
        ports = set()
        for line in listing.splitlines():
            fields = dict(part.split("=", 1) for part in line.split() if "=" in part and
                          part.split("=", 1)[0] in ("src", "dport"))  # the last src/dport win
            if fields.get("src") != machine.address and "dport" in fields:
                ports.add(int(fields["dport"]))
        return ports

    def close(self) -> None:
        for name in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "pids", name], capture_output=True)
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.namespaces.clear()
