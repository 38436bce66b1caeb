"""What checking reducers costs an honest collaboration: seconds per epoch of a backbone
and three peers (each its own process, started as users start them, on loopback) with
``verify_probability`` 0 (off), 0.1 and 1 (every part of every round), side by side and
interleaved so that the machine's drift hits each alike --

    python -m tests.bench.verification [--quick]

A checked part's inputs and result travel once more, reducer to checker, and the round
settles only after the check: the bytes that adds per round, next to the all-reduce's own
2(n-1)V, are p(n+1)V for n members and a V-element vector (p(n+1) / 2(n-1) of it).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from engine.project import AggregationSpec
from tests.collab.harness import MEDIUM
from tests.hostile.collaboration import Collaboration, hostile_project

PEERS = 3
SETTINGS = (0.0, 0.1, 1.0)


def seconds_per_epoch(probability: float, epochs: int) -> float:
    """Seconds per epoch over ``epochs`` epochs after a warm-up."""
    spec = hostile_project(task_params=MEDIUM, target_batch_size=192, round_timeout=20,
                           aggregation=AggregationSpec(verify_probability=probability))
    with tempfile.TemporaryDirectory() as root:
        collab = Collaboration(Path(root), project=spec, peers=PEERS)
        try:
            collab.start(warm_up_epochs=3, timeout=180)
            first, began = collab.epoch, time.monotonic()
            collab.wait_for(lambda: collab.epoch >= first + epochs, 600, f"{epochs} epochs")
            return (time.monotonic() - began) / (collab.epoch - first)
        finally:
            collab.stop()


def main(quick: bool) -> None:
    epochs, repeats = (10, 1) if quick else (40, 2)
    times: dict[float, list[float]] = {p: [] for p in SETTINGS}
    for _ in range(repeats):
        for p in SETTINGS:
            times[p].append(seconds_per_epoch(p, epochs))
    off = statistics.mean(times[0.0])
    n = PEERS
    print(f"\nreducer checks: {n} peers, demo-lm (medium), {epochs} epochs x {repeats} runs per setting")
    print(f"{'verify_probability':>18} {'s/epoch':>8} {'vs off':>7} {'extra bytes':>12}")
    for p in SETTINGS:
        extra = p * (n + 1) / (2 * (n - 1))
        mean = statistics.mean(times[p])
        print(f"{p:>18.2f} {mean:>8.3f} {mean / off:>6.2f}x {extra:>11.0%}")


if __name__ == "__main__":
    main("--quick" in sys.argv[1:])
