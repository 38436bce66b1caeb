"""A home cable for the bench's peers: a network namespace's uplink shaped as a home
router's (rate, queue, one-way delay), and a meter of what the peers' cables carried to
each other, apart from their traffic to the server (tests/bench/collaboration.py)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time

from tests.bench.local_mode import sent_bytes
from tests.nat.services import REPO
from tests.nat.topology import Host


def shape(host: Host, server: str, up_mbit: float, delay_ms: float) -> subprocess.Popen | None:
    """``host``'s uplink: ``up_mbit`` with a home router's queue (0.4 s deep) and ``delay_ms``
    on the way out; what goes to ``server`` is counted apart and not rate-limited. The
    delay is netem's where the kernel has it (sch_netem), else a delay line in user space
    (tests/nat/delay_line.py): then its process is returned, to stop when done."""
    host.run("iptables", "-I", "OUTPUT", "1", "-d", server, "-o", "eth0", "-j", "ACCEPT")
    tc = ["tc", "class", "add", "dev", "eth0", "parent", "1:"]
    host.run("tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "20",
             "r2q", "1000")
    host.run(*tc, "classid", "1:10", "htb", "rate", "1gbit")
    host.run(*tc, "classid", "1:20", "htb", "rate", f"{up_mbit}mbit", "ceil", f"{up_mbit}mbit",
             "burst", "32kb")
    host.run("tc", "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "u32", "match", "ip",
             "dst", f"{server}/32", "flowid", "1:10")
    queue = str(max(100, int(up_mbit * 1e6 * 0.4 / 8 / 1500)))  # packets
    child = ["tc", "qdisc", "add", "dev", "eth0", "parent"]
    try:
        host.run(*child, "1:10", "handle", "10:", "netem", "delay", f"{delay_ms}ms", "limit", "10000")
        host.run(*child, "1:20", "handle", "20:", "netem", "delay", f"{delay_ms}ms", "limit", queue)
        return None
    except RuntimeError as exc:
        if "unknown" not in str(exc):
            raise
    host.run(*child, "1:20", "handle", "20:", "pfifo", "limit", queue)
    line = subprocess.Popen([*host.prefix(), sys.executable, "-m", "tests.nat.delay_line", "--device", "eth0",
                             "--address", host.address, "--delay-ms", str(delay_ms)],
                            stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert line.stdout is not None
    if line.stdout.readline().strip() != "ready":
        line.kill()
        raise RuntimeError(f"the delay line in {host.namespace} did not start")
    return line


class CableMeter:
    """What the peers' cables carried to each other (not to the server), read every half
    second while a configuration runs: a window of steps is charged the bytes between its
    first step and its last, not the round cut short at the end, nor a start or a shutdown."""

    def __init__(self, hosts: list[Host], server: str) -> None:
        self.hosts, self.server = hosts, server
        self.readings: list[tuple[float, float, int]] = []  # (began, ended, bytes)
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> CableMeter:
        self._task = asyncio.ensure_future(self._run())
        return self

    async def __aexit__(self, *exc) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._read()  # past a last step in the final half second

    def between(self, start: float, end: float) -> int:
        """Bytes from the last reading done by ``start`` to the first begun after ``end``."""
        first = max((r for r in self.readings if r[1] <= start), default=self.readings[0])
        last = min((r for r in self.readings if r[0] >= end), default=self.readings[-1])
        return last[2] - first[2]

    async def _run(self) -> None:
        while True:
            await self._read()
            await asyncio.sleep(0.5)

    async def _read(self) -> None:
        began = time.monotonic()
        readings = await asyncio.to_thread(lambda: [sent_bytes(h, self.server) for h in self.hosts])
        carried = sum(total - to_server for total, to_server in readings)
        self.readings.append((began, time.monotonic(), carried))
