"""A grouped round's parts as the backbone checks them (engine/backbone/tracker/checks.py):
who reduced each, how large it is, and what a level-1 part's check compares -- its result
is the group's average, which its reducer alone holds and sent on as its level-2 parts
(engine/averaging/grouped_commitment.py)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.planning.grouped_indices import GroupedIndices
from engine.planning.partition import part_sizes
from engine.wire.control import RoundDone, RoundGroups


@dataclass(frozen=True)
class GroupedPart:
    index: int
    reducer: str
    size: int  # values
    level: int
    slot: int
    group: int


def indices_of(groups: RoundGroups, phases: int) -> GroupedIndices:
    return GroupedIndices([len(g) for g in groups.groups], len(groups.slot_shares), phases)


def grouped_parts(groups: RoundGroups, numel: int) -> list[GroupedPart]:
    """Every part of a one-phase grouped round of a ``numel``-value vector with a reducer."""
    indices = indices_of(groups, 1)
    slots = part_sizes(numel, groups.slot_shares)
    parts = []
    for g, reducers in enumerate(groups.reducers):
        for k, reducer in enumerate(reducers):
            parts.append(GroupedPart(indices.level_one_offset(g) + k, reducer, slots[k], 1, k, g))
    for k, size in enumerate(slots):
        for g, piece in enumerate(part_sizes(size, groups.pieces[k])):
            parts.append(GroupedPart(indices.level_two_offset(k) + g, groups.reducers[g][k], piece, 2, k, g))
    return sorted(parts, key=lambda p: p.index)


def place_of(groups: RoundGroups, index: int) -> GroupedPart:
    """Part ``index`` (of a one-phase grouped round; sizes not known here: 0)."""
    place = indices_of(groups, 1).place(index)
    if place.level == 1:
        reducers = groups.reducers[place.group]
        reducer = reducers[place.slot] if place.slot < len(reducers) else ""
        return GroupedPart(index, reducer, 0, 1, place.slot, place.group)
    return GroupedPart(index, groups.reducers[place.group][place.slot], 0, 2, place.slot, place.group)


def forwarded(groups: RoundGroups, part: GroupedPart, outcome: RoundDone) -> list[str | None]:
    """The level-2 parts the reducer of level-1 ``part`` committed to sending, by piece."""
    indices = indices_of(groups, 1)
    sent = outcome.commitment.sent if outcome.commitment is not None else []
    at = [indices.level_two_offset(part.slot) + g for g in range(len(groups.groups))]
    return [sent[i] if i < len(sent) else None for i in at]


def level_two_caps(groups: RoundGroups, caps: dict[str, int]) -> dict[str, int]:
    """What each slot reducer's level-2 parts count for at most: its group's caps."""
    out = {}
    for members, reducers in zip(groups.groups, groups.reducers, strict=True):
        total = sum(caps.get(p, 0) for p in members)
        out.update(dict.fromkeys(reducers, total))
    return out
