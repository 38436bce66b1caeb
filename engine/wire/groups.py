"""A round too large for one flat all-reduce, as the backbone tells its members to run it
in groups (engine/planning/groups.py plans it, engine/averaging/grouped.py runs it)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

from engine.wire.types import MAX_GROUP, PeerId, Share


class RoundGroups(Struct, kw_only=True):
    """How a round too large for one flat all-reduce runs in groups (engine/averaging/grouped.py):
    each group's reducer of slot k reduces its group's slot k, and the reducers of slot k
    across groups finish its pieces among themselves."""

    groups: Annotated[list[list[PeerId]], Meta(min_length=2, max_length=MAX_GROUP)]
    reducers: Annotated[list[list[PeerId]], Meta(max_length=MAX_GROUP)]  # per group, per slot
    slot_shares: Annotated[list[Share], Meta(min_length=1, max_length=MAX_GROUP)]
    pieces: Annotated[list[list[Share]], Meta(max_length=MAX_GROUP)]  # per slot, per group

    def __post_init__(self) -> None:
        slots, count = len(self.slot_shares), len(self.groups)
        if len(self.reducers) != count or any(len(r) != slots for r in self.reducers):
            raise ValueError("every group has one reducer per slot")
        if len(self.pieces) != slots or any(len(p) != count or sum(p) <= 0 for p in self.pieces):
            raise ValueError("every slot has one piece per group, not all empty")
        if sum(self.slot_shares) <= 0:
            raise ValueError("slot shares must have a positive sum")
        if any(not set(r) <= set(g) or len(set(r)) != len(r) for g, r in zip(self.groups, self.reducers,
                                                                             strict=True)):
            raise ValueError("a group's reducers are its own members, each once")
        if 2 * (sum(len(g) for g in self.groups) + slots * count) > MAX_GROUP:
            raise ValueError(f"a grouped round's parts, in two phases, number at most {MAX_GROUP}")
