"""Which documents (or images) of a project's inputs go to its held-out set: every n-th, or
as many as the author asks for, spread evenly over the inputs."""

from __future__ import annotations

from collections.abc import Callable


def every(n: int) -> Callable[[int], bool]:
    """Item ``number`` (counted from 1) is held out when it is a multiple of ``n``."""
    return lambda number: number % n == 0


def spread(total: int, size: int, noun: str) -> Callable[[int], bool]:
    """``size`` of ``total`` items, evenly apart (the last among them); at least one stays
    to train on."""
    if size < 1:
        raise ValueError(f"a held-out set needs at least one of the {noun} (--heldout {size})")
    if size >= total:
        raise ValueError(f"a held-out set of {size} would leave none of the {total} {noun} to train on "
                         f"(--heldout at most {total - 1})")
    return frozenset((i + 1) * total // size for i in range(size)).__contains__
