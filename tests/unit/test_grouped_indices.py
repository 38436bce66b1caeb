"""A grouped round's part indices (engine/planning/grouped_indices.py): one per part of the
whole round, each read back as the part it is."""

import pytest

from engine.planning.grouped_indices import GroupedIndices, Place


@pytest.mark.parametrize("phases", [1, 2])
def test_every_part_of_every_level_and_phase_has_its_own_index(phases):
    indices = GroupedIndices([4, 3, 4], slots=2, phases=phases)
    numbered = []
    for g, size in enumerate(indices.sizes):
        for phase in range(phases):
            numbered += [(indices.level_one_offset(g) + phase * size + j, Place(1, phase, g, j))
                         for j in range(size)]
    for slot in range(indices.slots):
        for phase in range(phases):
            numbered += [(indices.level_two_offset(slot) + phase * 3 + g, Place(2, phase, g, slot))
                         for g in range(3)]
    assert sorted(i for i, _ in numbered) == list(range(indices.count))
    assert all(indices.place(i) == place for i, place in numbered)
    with pytest.raises(ValueError, match="of a grouped round"):
        indices.place(indices.count)
