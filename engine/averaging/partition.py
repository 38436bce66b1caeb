"""Pure functions that split a flat vector into contiguous parts, one per reducer.

No network here: these decide *what* each peer sends, and are tested alone (how a reducer
combines its part is engine/averaging/robust.py).
"""

from __future__ import annotations

from collections.abc import Sequence


def part_sizes(total: int, shares: Sequence[float]) -> list[int]:
    """Split ``total`` elements into ``len(shares)`` contiguous parts proportional to ``shares``.

    Rounds with the largest-remainder method, so sizes always sum to ``total`` and a
    zero share always gets an empty part.
    """
    if total < 0:
        raise ValueError("total must not be negative")
    if not shares or any(s < 0 for s in shares) or sum(shares) <= 0:
        raise ValueError("shares must be non-negative with a positive sum")
    weight = float(sum(shares))
    exact = [total * s / weight for s in shares]
    sizes = [int(x) for x in exact]
    by_remainder = sorted(range(len(shares)), key=lambda i: (exact[i] - sizes[i], -i), reverse=True)
    for i in by_remainder[: total - sum(sizes)]:
        sizes[i] += 1
    return sizes


def part_bounds(total: int, shares: Sequence[float]) -> list[tuple[int, int]]:
    """(start, end) of each part."""
    bounds, start = [], 0
    for size in part_sizes(total, shares):
        bounds.append((start, start + size))
        start += size
    return bounds
