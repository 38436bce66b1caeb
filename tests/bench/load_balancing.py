"""DeDLOC's load balancing, priced: how long the tracker's LP takes (it runs for every round),
what it buys over equal shares on links like volunteers' (predicted round time, fluid
model), and what compressing a 25M-element part costs a peer's CPU next to the bytes saved.

    python -m tests.bench.load_balancing [--quick]
"""

from __future__ import annotations

import random
import statistics
import sys
import time

import torch

from engine.averaging.compression import decode, encode, encoded_size
from engine.planning.load_balancing import Member, balance, equal_shares, round_time

MBIT = 125_000.0


def home_links(n: int, rng: random.Random) -> list[Member]:
    """Home and university links: 5-100 Mbit/s down, a fifth to all of it up; 1 in 5 relayed."""
    links = []
    for _ in range(n):
        down = rng.choice([5, 10, 20, 40, 100]) * MBIT
        links.append(Member(down * rng.choice([0.2, 0.5, 1.0]), down, reduces=rng.random() > 0.2))
    if not any(m.reduces for m in links):
        links[0] = Member(links[0].upload, links[0].download)
    return links


def solve_times(repeats: int) -> None:
    rng = random.Random(0)
    print("LP solve time (two HiGHS solves), median of", repeats)
    for n in (4, 16, 64, 256):
        cases = [home_links(n, rng) for _ in range(repeats)]
        times = []
        for links in cases:
            began = time.perf_counter()
            balance(links, 1.0)
            times.append(time.perf_counter() - began)
        print(f"  {n:4d} peers: {statistics.median(times) * 1e3:7.1f} ms")


def speedups() -> None:
    print("predicted round time for 100 MB, LP vs equal shares")
    scenarios = {
        "4 equal 40/40 Mbit/s": [Member(40 * MBIT, 40 * MBIT)] * 4,
        "40/40, 20/5, 10/2, relayed 40/40": [Member(40 * MBIT, 40 * MBIT), Member(5 * MBIT, 20 * MBIT),
                                             Member(2 * MBIT, 10 * MBIT),
                                             Member(40 * MBIT, 40 * MBIT, reduces=False)],
        "same + auxiliary 100/100": [Member(40 * MBIT, 40 * MBIT), Member(5 * MBIT, 20 * MBIT),
                                     Member(2 * MBIT, 10 * MBIT), Member(40 * MBIT, 40 * MBIT, reduces=False),
                                     Member(100 * MBIT, 100 * MBIT, sends=False)],
        "one 1 Gbit/s server, 7 at 10/10": [Member(1000 * MBIT, 1000 * MBIT),
                                            *[Member(10 * MBIT, 10 * MBIT)] * 7],
        "64 home links (random)": home_links(64, random.Random(1)),
    }
    for name, links in scenarios.items():
        lp = balance(links, 100e6)
        equal = round_time(equal_shares(links), links, 100e6)
        print(f"  {name:36s} LP {lp.seconds:7.1f} s   equal {equal:7.1f} s   {equal / lp.seconds:5.2f}x")


def codecs(size: int) -> None:
    torch.set_num_threads(1)
    values = torch.randn(size)
    print(f"compression of {size / 1e6:.0f}M fp32 values ({4 * size / 1e6:.0f} MB), one thread")
    for method in ("fp16", "uint8"):
        began = time.perf_counter()
        payload = encode(values, method)
        encoded = time.perf_counter() - began
        decode(payload, size, method)
        decoded = time.perf_counter() - began - encoded
        # What the saved bytes are worth on a 20 Mbit/s uplink, for scale.
        saved = (4 * size - encoded_size(size, method)) / (20 * MBIT)
        print(f"  {method:6s} {4 * size / len(payload):4.2f}x fewer bytes   encode {encoded:5.2f} s   "
              f"decode {decoded:5.2f} s   saves {saved:6.1f} s of a 20 Mbit/s uplink")


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    solve_times(5 if quick else 30)
    speedups()
    codecs(2_000_000 if quick else 25_000_000)
