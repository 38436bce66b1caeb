"""Pure functions that split a flat vector into contiguous parts: each member's share of
it, in ``pieces`` parts of its own.

A reducer's share comes in pieces so that a round is a pipeline, as DeDLOC's fluid model
assumes: once every sender's first piece is in, its result flows back while the later
pieces still flow in. Part ``j`` belongs to member ``j // pieces``.

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


def part_bounds(total: int, shares: Sequence[float], pieces: int = 1) -> list[tuple[int, int]]:
    """(start, end) of each part: ``pieces`` parts per share, of near-equal sizes."""
    if pieces < 1:
        raise ValueError("a share comes in at least one piece")
    bounds, start = [], 0
    for size in part_sizes(total, shares):
        for piece in part_sizes(size, [1.0] * pieces):
            bounds.append((start, start + piece))
            start += piece
    return bounds
