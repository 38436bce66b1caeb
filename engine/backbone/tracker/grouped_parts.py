"""A grouped round's parts as the backbone checks them (engine/backbone/tracker/checks.py):
who reduced each, how large it is, and what a level-1 part's check compares -- its result
is the group's average, which its reducer alone holds and sent on as its level-2 parts
(engine/averaging/grouped_commitment.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from msgspec.structs import replace

from engine.planning.grouped_indices import GroupedIndices
from engine.planning.partition import part_sizes
from engine.wire.control import Audit, RoundDone, RoundGroups

if TYPE_CHECKING:
    from engine.backbone.tracker.scheduling import OpenRound


@dataclass(frozen=True)
class GroupedPart:
    index: int
    reducer: str
    size: int  # values
    level: int
    slot: int
    group: int
    phase: int = 0


def indices_of(groups: RoundGroups, phases: int) -> GroupedIndices:
    return GroupedIndices([len(g) for g in groups.groups], len(groups.slot_shares), phases)


def grouped_parts(groups: RoundGroups, lengths: list[int]) -> list[GroupedPart]:
    """Every part with a reducer of a grouped round whose phases' vectors have ``lengths``
    values (one phase; PowerSGD's two)."""
    indices = indices_of(groups, len(lengths))
    m = len(groups.groups)
    parts = []
    for phase, numel in enumerate(lengths):
        slots = part_sizes(numel, groups.slot_shares)
        for g, reducers in enumerate(groups.reducers):
            base = indices.level_one_offset(g) + phase * len(groups.groups[g])
            parts += [GroupedPart(base + k, reducer, slots[k], 1, k, g, phase)
                      for k, reducer in enumerate(reducers)]
        for k, size in enumerate(slots):
            base = indices.level_two_offset(k) + phase * m
            parts += [GroupedPart(base + g, groups.reducers[g][k], piece, 2, k, g, phase)
                      for g, piece in enumerate(part_sizes(size, groups.pieces[k]))]
    return sorted(parts, key=lambda p: p.index)


def place_of(groups: RoundGroups, phases: int, index: int) -> GroupedPart:
    """Part ``index`` (its size not known here: 0)."""
    place = indices_of(groups, phases).place(index)
    if place.level == 1:
        reducers = groups.reducers[place.group]
        reducer = reducers[place.slot] if place.slot < len(reducers) else ""
        return GroupedPart(index, reducer, 0, 1, place.slot, place.group, place.phase)
    return GroupedPart(index, groups.reducers[place.group][place.slot], 0, 2, place.slot, place.group,
                       place.phase)


def forwarded(groups: RoundGroups, phases: int, part: GroupedPart, outcome: RoundDone) -> list[str | None]:
    """The level-2 parts the reducer of level-1 ``part`` committed to sending, by piece."""
    indices = indices_of(groups, phases)
    sent = outcome.commitment.sent if outcome.commitment is not None else []
    base = indices.level_two_offset(part.slot) + part.phase * len(groups.groups)
    at = [base + g for g in range(len(groups.groups))]
    return [sent[i] if i < len(sent) else None for i in at]


def level_two_caps(groups: RoundGroups, caps: dict[str, int]) -> dict[str, int]:
    """What each slot reducer's level-2 parts count for at most: its group's caps."""
    out = {}
    for members, reducers in zip(groups.groups, groups.reducers, strict=True):
        total = sum(caps.get(p, 0) for p in members)
        out.update(dict.fromkeys(reducers, total))
    return out


def grouped_audit(audit: Audit, rnd: OpenRound, part: GroupedPart, reducer: RoundDone) -> Audit:
    """``audit`` of a grouped round's ``part`` as its checker must run it to judge as the
    reducer did: a level-1 part with what its reducer sent on, and not judged by its own
    part where it is an auxiliary member beside one proven trainer; a level-2 part as one
    of groups' sums."""
    groups = rnd.groups
    assert groups is not None
    if part.level == 2:
        return replace(audit, group_sums=True)
    members = groups.groups[part.group]
    proven = [p for p in members if p not in rnd.auxiliary and p not in rnd.optional]
    judged = not (part.reducer in rnd.auxiliary and len(proven) <= 1)
    return replace(audit, forwarded=forwarded(groups, rnd.phases, part, reducer),
                   pieces=groups.pieces[part.slot], judged=judged)
