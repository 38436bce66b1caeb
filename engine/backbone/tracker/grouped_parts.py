"""A grouped round's parts as the backbone checks them (engine/backbone/tracker/checks.py):
who reduced each, how large it is, and what a level-1 part's check compares -- its result
is the group's average, which its reducer alone holds and sent on as its level-2 parts
(engine/averaging/grouped_commitment.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from msgspec.structs import replace

from engine.backbone.ledger import bytes_aggregated
from engine.planning.grouped_indices import GroupedIndices
from engine.planning.partition import part_sizes
from engine.planning.slot_reducers import level_two_caps
from engine.project import Codec
from engine.wire.control import Audit, RoundDone
from engine.wire.groups import RoundGroups

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


def grouped_parts(groups: RoundGroups, lengths: list[int], reducers: list[list[str]]) -> list[GroupedPart]:
    """Every part with a reducer of a grouped round whose phases' vectors have ``lengths``
    values (one phase; PowerSGD's two); ``reducers``: each group's reducer of each slot now
    (OpenRound.slot_reducers: a backup, for a lost one's slot)."""
    indices = indices_of(groups, len(lengths))
    m = len(groups.groups)
    parts = []
    for phase, numel in enumerate(lengths):
        slots = part_sizes(numel, groups.slot_shares)
        for g, slot_reducers in enumerate(reducers):
            base = indices.level_one_offset(g) + phase * len(groups.groups[g])
            parts += [GroupedPart(base + k, reducer, slots[k], 1, k, g, phase)
                      for k, reducer in enumerate(slot_reducers)]
        for k, size in enumerate(slots):
            base = indices.level_two_offset(k) + phase * m
            parts += [GroupedPart(base + g, reducers[g][k], piece, 2, k, g, phase)
                      for g, piece in enumerate(part_sizes(size, groups.pieces[k]))]
    return sorted(parts, key=lambda p: p.index)


def place_of(groups: RoundGroups, phases: int, index: int, reducers: list[list[str]]) -> GroupedPart:
    """Part ``index`` (its size not known here: 0), reduced by ``reducers`` (per group, per
    slot: the round's as it opened, or as backups took slots over)."""
    place = indices_of(groups, phases).place(index)
    slot_reducers = reducers[place.group]
    reducer = slot_reducers[place.slot] if place.slot < len(slot_reducers) else ""
    return GroupedPart(index, reducer, 0, place.level, place.slot, place.group, place.phase)


def first_combiner(rnd: OpenRound, index: int, reducer: str) -> tuple[str, bool]:
    """Who the round opened with as part ``index``'s reducer, and whether that one, not
    ``reducer``, combined it first (a backup that took a slot over combines all of it, or
    has its inputs)."""
    assert rnd.groups is not None
    first = place_of(rnd.groups, rnd.phases, index, rnd.groups.reducers).reducer
    return first, first != reducer


def level_two_caps_of(rnd: OpenRound, caps: dict[str, int]) -> dict[str, int]:
    """What the level-2 parts of each slot reducer count for at most. A reducer lost midway
    may have sent its group's sum before it left: its cap is its group's, as it was for the
    reducers that took it."""
    assert rnd.groups is not None
    groups, first = rnd.groups.groups, rnd.groups.reducers
    return level_two_caps(groups, first, caps) | level_two_caps(groups, rnd.slot_reducers(), caps)


def forwarded(groups: RoundGroups, phases: int, part: GroupedPart, outcome: RoundDone) -> list[str | None]:
    """The level-2 parts the reducer of level-1 ``part`` committed to sending, by piece."""
    indices = indices_of(groups, phases)
    sent = outcome.commitment.sent if outcome.commitment is not None else []
    base = indices.level_two_offset(part.slot) + part.phase * len(groups.groups)
    at = [base + g for g in range(len(groups.groups))]
    return [sent[i] if i < len(sent) else None for i in at]


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


def grouped_bytes_reduced(rnd: OpenRound, reducer: str, lengths: list[int], received: dict[str, int],
                          seen: dict[str, int], codec: Codec) -> int:
    """What ``reducer`` took in, in the grouped round ``rnd`` whose phases' vectors have
    ``lengths`` values: each slot it reduced from the members of its own group it says it
    received and the group's reducers saw bring samples, and each piece it finished at
    level 2 from the other groups that brought any (their reducers' sums)."""
    groups = rnd.groups
    assert groups is not None
    brought = [any(seen.get(p, 0) > 0 for p in members) for members in groups.groups]
    total = 0
    for part in grouped_parts(groups, lengths, rnd.slot_reducers()):
        if part.reducer != reducer:
            continue
        if part.level == 1:
            senders = sum(1 for p in groups.groups[part.group] if p in received and seen.get(p, 0) > 0)
        else:
            senders = sum(brought) - brought[part.group]
        total += bytes_aggregated([part.size], senders, codec)
    return total
