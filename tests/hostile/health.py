"""A bystander timing ``GET /api/health`` while an attack runs: each request on a new
connection from the bystander's own address, in a process of its own, so that what is timed
is the backbone and not the attacker's event loop.

    python -m tests.hostile.health URL ADDRESS INTERVAL

prints one latency (seconds) a line until its stdin closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

TIMEOUT = 5.0  # a request that takes longer counts as this long


class HealthProbe:
    """``with HealthProbe(url, address) as probe: ...``; then ``probe.p99`` and friends."""

    def __init__(self, url: str, address: str, interval: float = 0.02) -> None:
        self.command = [sys.executable, "-m", "tests.hostile.health", url, address, str(interval)]
        self.latencies: list[float] = []
        self._first = threading.Event()
        self._popen: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> HealthProbe:
        self._popen = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._first.wait(30):
            raise AssertionError("the health probe never answered")
        self.latencies.clear()  # the prober's own start-up is not the backbone's
        return self

    def __exit__(self, *exc) -> None:
        assert self._popen is not None and self._popen.stdin is not None and self._reader is not None
        self._popen.stdin.close()
        self._popen.wait(30)
        self._reader.join(30)

    def _read(self) -> None:
        assert self._popen is not None and self._popen.stdout is not None
        for line in self._popen.stdout:
            self.latencies.append(float(line))
            self._first.set()

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]

    @property
    def p99(self) -> float:
        return self.quantile(0.99)

    def figure(self) -> str:
        return (f"/api/health from a bystander: {len(self.latencies)} requests, p50 "
                f"{self.quantile(0.5) * 1000:.1f} ms, p99 {self.p99 * 1000:.1f} ms, "
                f"max {max(self.latencies) * 1000:.1f} ms")


async def _once(host: str, port: int, address: str) -> float:
    began = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, local_addr=(address, 0)), TIMEOUT)
        writer.write(f"GET /api/health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        answer = await asyncio.wait_for(reader.read(), TIMEOUT - (time.perf_counter() - began))
        writer.close()
        if not answer.startswith(b"HTTP/1.1 200"):
            return TIMEOUT
    except (OSError, asyncio.TimeoutError):
        return TIMEOUT
    return time.perf_counter() - began


async def _main(url: str, address: str, interval: float) -> None:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(stop.set)),
                     daemon=True).start()
    while not stop.is_set():
        print(await _once(parts.hostname, parts.port, address), flush=True)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)  # pacing between requests


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
