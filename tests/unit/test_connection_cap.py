"""The cap on TCP connections per address group, and the gate that applies it as each
connection is accepted (fake transports: no sockets)."""

import asyncio
from typing import ClassVar

from engine.backbone.connections import ConnectionCap, _Gate


class Transport(asyncio.Transport):
    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address
        self.closed = False

    def get_extra_info(self, name, default=None):
        return (self.address, 40000, 0, 0) if name == "peername" else default

    def close(self) -> None:
        self.closed = True


class Recorder(asyncio.Protocol):
    """What aiohttp's protocol would see."""

    made: ClassVar[list["Recorder"]] = []

    def __init__(self) -> None:
        self.events: list[str] = []
        Recorder.made.append(self)

    def connection_made(self, transport) -> None:
        self.events.append("made")

    def data_received(self, data: bytes) -> None:
        self.events.append(data.decode())

    def connection_lost(self, exc) -> None:
        self.events.append("lost")


def connect(cap: ConnectionCap, address: str) -> tuple[_Gate, Transport]:
    gate, transport = _Gate(Recorder, cap), Transport(address)
    gate.connection_made(transport)
    return gate, transport


def test_a_host_rotating_through_its_64_is_capped_as_one_and_closed_before_http_sees_it():
    Recorder.made.clear()
    cap = ConnectionCap(limit=128, ipv6_prefix=64)
    opened = [connect(cap, f"2001:db8:a:b::{i:x}") for i in range(1, 3001)]
    refused = [t for _, t in opened if t.closed]
    assert len(refused) == 3000 - 128 and len(Recorder.made) == 128
    assert cap.open("2001:db8:a:b::/64") == 128
    # Another /64 and IPv4 hosts are counted apart.
    assert not connect(cap, "2001:db8:a:c::1")[1].closed
    assert not connect(cap, "198.51.100.1")[1].closed
    # A connection that ends frees its place.
    gate, _ = opened[0]
    gate.connection_lost(None)
    assert Recorder.made[0].events == ["made", "lost"]
    assert not connect(cap, "2001:db8:a:b::ffff")[1].closed
    assert connect(cap, "2001:db8:a:b::fffe")[1].closed


def test_refused_connections_release_nothing_and_admitted_ones_pass_everything_on():
    Recorder.made.clear()
    cap = ConnectionCap(limit=1, ipv6_prefix=64)
    first, _ = connect(cap, "203.0.113.5")
    second, transport = connect(cap, "::ffff:203.0.113.5")  # the same host on a dual-stack socket
    assert transport.closed
    second.data_received(b"GET / HTTP/1.1\r\n")
    second.connection_lost(None)
    assert cap.open("203.0.113.5") == 1
    first.data_received(b"GET / HTTP/1.1\r\n")
    first.connection_lost(None)
    assert Recorder.made[0].events == ["made", "GET / HTTP/1.1\r\n", "lost"]
    assert cap.open("203.0.113.5") == 0


def test_a_trusted_proxy_carries_everyones_connections_uncapped():
    cap = ConnectionCap(limit=2, ipv6_prefix=64, exempt=frozenset({"127.0.0.1"}))
    assert not any(connect(cap, "127.0.0.1")[1].closed for _ in range(500))
    assert [connect(cap, "127.0.0.2")[1].closed for _ in range(3)] == [False, False, True]
