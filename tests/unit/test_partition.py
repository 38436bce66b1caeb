import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.planning.partition import part_bounds, part_sizes


@given(st.integers(0, 10**7), st.lists(st.floats(0, 100), min_size=1, max_size=64))
def test_parts_cover_the_vector_exactly(total, shares):
    if sum(shares) <= 0:
        with pytest.raises(ValueError):
            part_sizes(total, shares)
        return
    sizes = part_sizes(total, shares)
    assert sum(sizes) == total
    assert all(size == 0 for size, share in zip(sizes, shares, strict=True) if share == 0)
    exact = [total * s / sum(shares) for s in shares]
    assert all(abs(size - e) < 1 + 1e-9 for size, e in zip(sizes, exact, strict=True))


def test_bounds_are_contiguous_and_ordered():
    bounds = part_bounds(10, [1, 1, 1])
    assert bounds == [(0, 4), (4, 7), (7, 10)]


@given(st.integers(0, 10**6), st.lists(st.floats(0, 100), min_size=1, max_size=16), st.integers(1, 8))
def test_pieces_split_each_share_and_still_tile_the_vector(total, shares, pieces):
    if sum(shares) <= 0:
        return
    whole = part_bounds(total, shares)
    split = part_bounds(total, shares, pieces)
    assert len(split) == len(shares) * pieces
    for member, (lo, hi) in enumerate(whole):
        own = split[member * pieces:(member + 1) * pieces]
        assert own[0][0] == lo and own[-1][1] == hi
        assert all(a[1] == b[0] for a, b in itertools.pairwise(own))
        sizes = [b - a for a, b in own]
        assert max(sizes) - min(sizes) <= 1
