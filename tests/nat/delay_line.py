"""A delay line in user space, for kernels without netem (sch_netem): what a machine in a
network namespace sends to the public segment leaves its cable ``delay`` later, as over a
long-distance link. The approach is mahimahi's DelayShell (Netravali et al., USENIX ATC
2015): the segment's route points into a TUN device; this process reads each IP packet
there, holds it, and sends it on through a raw socket whose mark routes it out of the
machine's real interface (and through that interface's shaping, ``bench.home_cables``'s
htb) instead of back into the TUN device.

    ip netns exec NS python -m tests.nat.delay_line --device eth0 --address A --delay-ms 15

Run it in the namespace it delays (it sets the routes up itself, and takes them down when
stopped); it prints ``ready`` once packets go through it. IPv4 only, one direction: the
machine's way out. Packets are held in arrival order (a constant delay keeps it), so the
line reorders nothing.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import os
import select
import signal
import socket
import struct
import subprocess
import time

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
MARK = 0x64  # what the line's own sends carry: their route skips the TUN device
TABLE = "100"
MAX_HELD = 100_000  # packets: a queue past this drops, as a full router's would


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def route_through(tun: str, device: str, address: str, prefix: str) -> None:
    """The segment's traffic into ``tun``; the line's own (marked) out of ``device``."""
    ip("link", "set", tun, "up")
    ip("route", "replace", prefix, "dev", tun, "src", address)
    ip("route", "add", prefix, "dev", device, "src", address, "table", TABLE)
    ip("rule", "add", "fwmark", str(MARK), "table", TABLE)
    # Replies come in on ``device`` while the route back points into ``tun``: a strict
    # reverse-path filter would drop them.
    for conf in ("all", device):
        with open(f"/proc/sys/net/ipv4/conf/{conf}/rp_filter", "w") as f:
            f.write("0")


def restore(device: str, address: str, prefix: str) -> None:
    ip("route", "replace", prefix, "dev", device, "proto", "kernel", "scope", "link", "src", address)
    ip("rule", "del", "fwmark", str(MARK), "table", TABLE)


def run(tun: int, delay: float, stop: list[bool]) -> None:
    out = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    out.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, MARK)
    held: collections.deque[tuple[float, bytes]] = collections.deque()
    while not stop[0]:
        wait = max(0.0, held[0][0] - time.monotonic()) if held else 0.5
        try:
            readable, _, _ = select.select([tun], [], [], wait)
        except InterruptedError:
            continue
        if readable:
            due = time.monotonic() + delay
            while True:
                try:
                    packet = os.read(tun, 65535)
                except BlockingIOError:
                    break
                if len(held) < MAX_HELD and packet[:1] and packet[0] >> 4 == 4:
                    held.append((due, packet))
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, packet = held.popleft()
            with contextlib.suppress(OSError):  # (its queue is full: dropped, as it would be there)
                out.sendto(packet, (socket.inet_ntoa(packet[16:20]), 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", required=True, help="the machine's interface to the segment")
    parser.add_argument("--address", required=True, help="the machine's address on it")
    parser.add_argument("--prefix", default="100.64.0.0/24", help="the segment")
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--tun", default="dly0")
    args = parser.parse_args()
    stop = [False]

    def stopping(*_: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    tun = open_tun(args.tun)
    route_through(args.tun, args.device, args.address, args.prefix)
    print("ready", flush=True)
    try:
        run(tun, args.delay_ms / 1000, stop)
    finally:
        restore(args.device, args.address, args.prefix)


if __name__ == "__main__":
    main()
