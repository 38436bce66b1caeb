import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.averaging.partition import part_bounds, part_sizes


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
