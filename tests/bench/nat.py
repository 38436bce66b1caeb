"""Connection set-up per path type, and averaging a fixed tensor directly vs through TURN.

Runs in network namespaces (root): the NAT test network of tests/nat. Every pair connects
fresh through a real backbone; set-up covers ICE, DTLS and SCTP up to an open data channel.

    sudo python -m tests.bench.nat [--quick]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

from tests.nat.network import nat_network
from tests.nat.services import run_probes
from tests.nat.topology import missing_requirements

TENSOR_MB = 16


async def measure(net, quick: bool) -> list[tuple[str, str, list[dict]]]:
    backbone, url = net.backbone(8480)
    trials = 2 if quick else 5
    cases = [
        ("same LAN (host)", (net.host, net.lan_host), ()),
        ("two cone NATs (srflx)", (net.cone, net.cone2), ()),
        ("cone + symmetric NAT (relay)", (net.cone, net.symmetric), ()),
        ("same LAN, relay-only policy (relay)", (net.host, net.lan_host), ("--relay-only",)),
    ]
    rows = []
    try:
        for label, (a, b), extra in cases:
            reports = []
            for _ in range(trials):
                first, second = await run_probes(a, b, url, "tiny-lm", net.workdir,
                                                 "--tensor-mb", str(TENSOR_MB), *extra, timeout=300)
                if not (first["ok"] and second["ok"]):
                    raise RuntimeError(f"{label}: {first} {second}")
                reports.append(first)
            rows.append((label, reports[0]["path"], reports))
    finally:
        backbone.stop()
    return rows


def main(quick: bool = False) -> None:
    print(f"\n== NAT traversal: connection set-up and averaging {TENSOR_MB} MB between two peers")
    missing = missing_requirements()
    if missing:
        print(f"skipped: {missing}")
        return
    with tempfile.TemporaryDirectory(prefix="cotrain-bench-nat-") as tmp, nat_network(Path(tmp)) as net:
        rows = asyncio.run(measure(net, quick))
    direct = statistics.median(r["allreduce_seconds"] for r in rows[0][2])
    print(f"{'path':<38}{'kind':>7}{'set-up median':>15}{'set-up max':>12}{'average':>10}{'vs LAN':>8}")
    for label, kind, reports in rows:
        setup = [r["connect_seconds"] for r in reports]
        average = statistics.median(r["allreduce_seconds"] for r in reports)
        print(f"{label:<38}{kind:>7}{statistics.median(setup):>14.2f}s{max(setup):>11.2f}s"
              f"{average:>9.2f}s{average / direct:>7.2f}x")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
