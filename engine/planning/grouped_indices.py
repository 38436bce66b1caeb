"""Where each part of a grouped round travels, is committed and is checked: one index per
part across the whole round, so that a round's commitments and the backbone's checks read
a grouped round as they read a flat one (engine/averaging/grouped.py runs it).

Per phase (PowerSGD has two), level 1 of group g numbers its parts after every earlier
group's, one per member of the group (its slot reducers' first, in slot order: the other
members' are empty); level 2 of slot k then numbers one part per group (its pieces), after
every level-1 part of every phase. Pure: no network, tested alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Place:
    level: Literal[1, 2]
    phase: int
    group: int  # level 1: the group; level 2: the group whose slot reducer finishes the piece
    slot: int  # level 1: the part's position in its group (a slot, if below ``slots``)
    # level 2: the slot the piece belongs to


@dataclass(frozen=True)
class GroupedIndices:
    sizes: list[int]  # members per group
    slots: int
    phases: int = 1

    @property
    def members(self) -> int:
        return sum(self.sizes)

    @property
    def count(self) -> int:
        """Indices in the round."""
        return self.phases * (self.members + self.slots * len(self.sizes))

    def level_one_offset(self, group: int) -> int:
        """Level 1's part j of phase k in ``group`` is this plus k * its size + j."""
        return self.phases * sum(self.sizes[:group])

    def level_two_offset(self, slot: int) -> int:
        """Level 2's piece j of phase k of ``slot`` is this plus k * groups + j."""
        return self.phases * (self.members + slot * len(self.sizes))

    def place(self, index: int) -> Place:
        """What part ``index`` is; ValueError past the round's indices."""
        if not 0 <= index < self.count:
            raise ValueError(f"part {index} of a grouped round of {self.count} parts")
        first = self.phases * self.members
        if index < first:
            for g, size in enumerate(self.sizes):
                base = self.level_one_offset(g)
                if index < base + self.phases * size:
                    phase, j = divmod(index - base, size)
                    return Place(1, phase, g, j)
        slot, rest = divmod(index - first, self.phases * len(self.sizes))
        phase, group = divmod(rest, len(self.sizes))
        return Place(2, phase, group, slot)
