"""The user-space delay line the home-links bench uses where the kernel has no netem
(tests/nat/delay_line.py): a machine's packets leave it as late as asked, through its
shaping, at the shaped rate, and its routes are as they were once the line stops."""

import os
import subprocess
import sys

import pytest

from tests.nat.services import REPO
from tests.nat.topology import Host, Topology, missing_requirements

pytestmark = [pytest.mark.skipif(missing_requirements() is not None, reason=str(missing_requirements())),
              pytest.mark.skipif(not os.path.exists("/dev/net/tun"), reason="needs /dev/net/tun (TUN)")]

ECHO = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", 9999))
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("0.0.0.0", 9998)); t.listen()
print("up", flush=True)
import threading
def sink():
    while True:
        c, _ = t.accept()
        while c.recv(1 << 16):
            pass
        c.close()
threading.Thread(target=sink, daemon=True).start()
while True:
    d, a = s.recvfrom(2048); s.sendto(d, a)
"""

PROBE = """
import socket, statistics, sys, time
to = sys.argv[1]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)
rtts = []
for _ in range(15):
    began = time.monotonic(); s.sendto(b"x" * 1000, (to, 9999)); s.recvfrom(2048)
    rtts.append(time.monotonic() - began)
t = socket.create_connection((to, 9998), timeout=10)
chunk, sent, began = b"\\0" * (1 << 16), 0, time.monotonic()
while time.monotonic() - began < 3:
    t.sendall(chunk); sent += len(chunk)
print(statistics.median(rtts) * 1000, sent * 8 / (time.monotonic() - began) / 1e6)
"""


def probe(a: Host, b: Host) -> tuple[float, float]:
    """(median RTT in ms, TCP Mbit/s) from ``a`` to ``b``."""
    done = subprocess.run([*a.prefix(), sys.executable, "-c", PROBE, b.address], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rtt, rate = map(float, done.stdout.split())
    return rtt, rate


def test_a_machines_packets_leave_as_late_as_asked_at_its_shaped_rate_and_its_routes_come_back(report_figure):
    topology = Topology()
    echo = line = None
    try:
        a, b = topology.public_peer(upload_mbit=40), topology.public_peer()
        echo = subprocess.Popen([*b.prefix(), sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True)
        assert echo.stdout is not None and echo.stdout.readline().strip() == "up"
        routes = a.run("ip", "route")
        plain_rtt, plain_rate = probe(a, b)
        line = subprocess.Popen([*a.prefix(), sys.executable, "-m", "tests.nat.delay_line", "--device",
                                 "eth0", "--address", a.address, "--delay-ms", "25"], stdout=subprocess.PIPE,
                                text=True, cwd=REPO)
        assert line.stdout is not None and line.stdout.readline().strip() == "ready"
        rtt, rate = probe(a, b)
        line.terminate()
        assert line.wait(10) == 0
        assert a.run("ip", "route") == routes
        after_rtt, _ = probe(a, b)
    finally:
        for process in (echo, line):
            if process is not None and process.poll() is None:
                process.kill()
        topology.close()
    # (once stopped, nothing is held: what is left is the cable's queue, still draining the
    # bulk transfer through it)
    assert plain_rtt < 5 and after_rtt < 25
    assert 25 <= rtt < 25 + 15  # (one way only: the echo's way back is not delayed)
    # The line is not the bottleneck: TCP through it, over 25 ms, still fills the 40 Mbit/s
    # cable (a window of 40 Mbit/s x 25 ms is 125 kB, within Linux's default).
    assert rate > 0.7 * 40 and plain_rate > 0.7 * 40, (rate, plain_rate)
    report_figure(f"25 ms asked: {rtt:.1f} ms RTT through the line ({plain_rtt:.2f} ms without); TCP over it "
                  f"{rate:.1f} Mbit/s on a 40 Mbit/s cable ({plain_rate:.1f} without)")
