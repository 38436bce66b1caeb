"""What robust aggregation costs a reducer: seconds to combine one 25M-element part from 4
and from 16 senders, side by side in one run --

- ``sum``: the plain weighted sum a reducer did before any checks (the floor);
- ``mean``: the same after the checks every part now passes (finite, norm, sample cap);
- ``centered_clip``: the checks, then CenteredClip (the project's clip_iterations).

    python -m tests.bench.aggregation [--quick]

The ratios to ``sum`` are what to compare across machines. For scale: averaging a 25M
vector between two peers over loopback takes about 20 s (python -m tests.bench.allreduce).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from engine.averaging.robust import Contribution, aggregate
from engine.project import AggregationSpec

SAMPLES = 32


def contributions(n: int, size: int) -> list[Contribution]:
    torch.manual_seed(0)
    truth = torch.randn(size)
    return [Contribution(f"peer-{i}", (truth + 0.3 * torch.randn(size)) * SAMPLES, SAMPLES) for i in range(n)]


def plain_sum(parts: list[Contribution]) -> torch.Tensor:
    out = torch.zeros_like(parts[0].values)
    for c in parts:
        out.add_(c.values)
    return out.div_(sum(c.samples for c in parts))


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def row(senders: int, size: int, repeats: int) -> tuple[float, float, float]:
    """Seconds for (sum, mean, centered_clip) of ``senders`` contributions."""
    parts = contributions(senders, size)
    return (timed(lambda: plain_sum(parts), repeats),
            timed(lambda: aggregate(parts, AggregationSpec(method="mean"), 10**9), repeats),
            timed(lambda: aggregate(parts, AggregationSpec(method="centered_clip"), 10**9), repeats))


def main(quick: bool) -> None:
    size, repeats = (2_000_000, 3) if quick else (25_000_000, 3)
    torch.set_num_threads(1)  # a reducer's compute thread
    spec = AggregationSpec()
    print(f"combining one part of {size / 1e6:.0f}M fp32 elements, one thread, median of {repeats} "
          f"(centered_clip: radius {spec.clip_radius}, at most {spec.clip_iterations} iterations)")
    print(f"{'senders':>8} {'sum s':>8} {'mean s':>8} {'clip s':>8} {'mean/sum':>9} {'clip/sum':>9} "
          f"{'clip/mean':>10}")
    for n in (4, 16):
        floor, mean, clip = row(n, size, repeats)
        print(f"{n:>8} {floor:>8.3f} {mean:>8.3f} {clip:>8.3f} {mean / floor:>8.1f}x {clip / floor:>8.1f}x "
              f"{clip / mean:>9.1f}x")


if __name__ == "__main__":
    main("--quick" in sys.argv[1:])
