"""Grouped rounds, planned for a swarm of 1,000 on home links: the LP over groups
(engine/planning/groups.py) against the flat round's (load_balancing.py), side by side.

    python -m tests.bench.grouped_schedule [--quick]

Per configuration: the most links any member keeps open, the predicted round time (the
fluid model's transfer time, plus one round trip per hop: two in a flat round, four in a
grouped one), and how long planning takes. Links are what limit a flat round of many: each
is a WebRTC connection (ICE, DTLS, SCTP) to open across NATs (0.5-0.6 s each, measured in
tests.bench.nat) and to keep alive, and a part per link shrinks to a few kilobytes.
"""

from __future__ import annotations

import random
import sys
import time

from engine.planning.groups import plan_groups
from engine.planning.load_balancing import Member, balance

MBIT = 125_000.0
# The collaboration bench's home links (down/up Mbit/s), and round trips between homes.
LINKS = ((300, 60), (100, 20), (50, 10), (20, 5))
RTT = (0.020, 0.080)
PARAMETERS = 25_000_000


def swarm(n: int, links: tuple[tuple[int, int], ...], seed: int = 0) -> tuple[list[Member], float]:
    """``n`` members on these links, a tenth of them in client mode (behind a NAT no one can
    reach: they send, never reduce); and the worst round trip among them."""
    rng = random.Random(seed)
    members = []
    for i in range(n):
        down, up = rng.choice(links)
        members.append(Member(up * MBIT, down * MBIT, reduces=i % 10 != 0))
    return members, max(rng.uniform(*RTT) for _ in range(n))


def flat(members: list[Member], nbytes: float, rtt: float) -> tuple[int, float, float]:
    began = time.perf_counter()
    plan = balance(members, nbytes)
    planning = time.perf_counter() - began
    reducers = sum(s > 0 for s in plan.shares)
    return len(members) - 1 if reducers else 0, plan.seconds + 2 * rtt, planning


def grouped(members: list[Member], size: int, nbytes: float, rtt: float) -> tuple[int, float, float]:
    began = time.perf_counter()
    plan = plan_groups(members, size, nbytes)
    planning = time.perf_counter() - began
    return max(plan.links()), plan.seconds + 4 * rtt, planning


def main(quick: bool = False) -> None:
    n = 200 if quick else 1000
    balance([Member(1.0, 1.0)] * 2, 1.0)  # (scipy imported before anything is timed)
    for title, links in (("home links", LINKS), ("symmetric 100 Mbit/s links", ((100, 100),))):
        members, rtt = swarm(n, links)
        print(f"\n== A round of {n} members on {title} ({', '.join(f'{d}/{u}' for d, u in links)} "
              f"Mbit/s down/up, a tenth in client mode), worst round trip {rtt * 1000:.0f} ms")
        for precision, width in (("fp32", 4), ("fp16", 2)):
            nbytes = PARAMETERS * width
            print(f"{PARAMETERS / 1e6:.0f}M parameters in {precision} ({nbytes / 1e6:.0f} MB a round):")
            links_kept, seconds, planning = flat(members, nbytes, rtt)
            print(f"  flat round:        {links_kept:4d} links per member, predicted {seconds:6.1f} s, "
                  f"planned in {planning * 1000:6.0f} ms")
            for size in (8, 16, 32, 64):
                links_kept, seconds, planning = grouped(members, size, nbytes, rtt)
                print(f"  groups of {size:2d} ({-(-n // size):3d}): {links_kept:4d} links per member, "
                      f"predicted {seconds:6.1f} s, planned in {planning * 1000:6.0f} ms", flush=True)
    print("(On home links both wait for the slowest uploader to send its whole vector once: grouping "
          "costs no time there. On even links it moves a slot's worth more per reducer.)")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
