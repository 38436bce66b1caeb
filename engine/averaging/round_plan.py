"""A round as one member takes part in it: the one description every step of a round reads,
derived from the backbone's RoundStart by ``RoundPlan.of`` alone."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import msgspec

from engine.averaging.errors import AveragingError
from engine.planning.grouped_indices import GroupedIndices
from engine.project import AggregationSpec, Codec, CompressionMethod, codec_of
from engine.wire.control import RoundGroups, RoundStart
from engine.wire.types import MAX_GROUP


class RoundChanges:
    """The backbone's word on members lost midway through a round (control: Reassign), as
    it comes: whom to wait for no longer, and who reduces each part now."""

    def __init__(self) -> None:
        self.lost: frozenset[str] = frozenset()
        self.reducers: list[str] | None = None
        self._changed = asyncio.Event()

    def update(self, lost: Iterable[str], reducers: list[str]) -> None:
        self.lost, self.reducers = frozenset(lost), list(reducers)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait(self) -> None:
        """Until the next update."""
        await self._changed.wait()


@dataclass(frozen=True)
class GroupedRound:
    """Who is in which group, who reduces which slot, and how large slots and pieces are."""

    groups: list[list[str]]  # member ids, per group
    reducers: list[list[str]]  # per group, its reducer of each slot (slot k: the k-th)
    slot_shares: list[float]  # per slot, its share of the vector
    pieces: list[list[float]]  # per slot, per group: the share of the slot its reducer finishes

    def __post_init__(self) -> None:
        slots = len(self.slot_shares)
        if any(len(r) != slots for r in self.reducers) or len(self.pieces) != slots:
            raise ValueError(f"every group has one reducer for each of the {slots} slots")
        for group, reducers in zip(self.groups, self.reducers, strict=True):
            if not set(reducers) <= set(group):
                raise ValueError(f"a group's reducers {reducers} are not all in it")

    @classmethod
    def of(cls, groups: RoundGroups) -> GroupedRound:
        return cls(groups.groups, groups.reducers, groups.slot_shares, groups.pieces)

    def group_of(self, member: str) -> int:
        return next(g for g, group in enumerate(self.groups) if member in group)

    def indices(self, phases: int) -> GroupedIndices:
        return GroupedIndices([len(g) for g in self.groups], len(self.slot_shares), phases)

    # Both levels share the round's word on members lost midway (``RoundPlan.changes``): a
    # member that left is waited for no longer, and a slot reducer that left fails the round
    # at once (no backup takes a slot over yet), not at its deadline.

    def level_one(self, plan: RoundPlan) -> RoundPlan:
        """The round within our group: its slot reducers first, in slot order, so that slot
        k covers the same values in every group. Every part of the round travels, is
        committed and is checked under an index of its own (planning/grouped_indices.py)."""
        g = self.group_of(plan.me)
        reducers = self.reducers[g]
        members = reducers + [p for p in self.groups[g] if p not in reducers]
        shares = self.slot_shares + [0.0] * (len(members) - len(reducers))
        return replace(plan, group=members, shares=shares, pieces=1, grouped=True, groups=None,
                       results_codec="none",
                       offset=self.indices(plan.phases).level_one_offset(g),
                       optional=plan.optional & set(members), auxiliary=plan.auxiliary & set(members),
                       caps={p: c for p, c in plan.caps.items() if p in members})

    def level_two(self, plan: RoundPlan, slot: int) -> RoundPlan:
        """The round among the reducers of ``slot``, one per group, on their groups' sums."""
        members = [reducers[slot] for reducers in self.reducers]
        caps = {}
        if plan.caps:
            caps = {r: sum(plan.caps.get(p, 0) for p in group) for r, group in zip(members, self.groups,
                                                                                     strict=True)}
        # (A group's sum weighs as the samples its members brought, within their caps: a share
        # of the target batch bounds one sender, not a group.)
        aggregation = msgspec.structs.replace(plan.aggregation, max_sample_share=None)
        return replace(plan, group=members, shares=self.pieces[slot], pieces=1, optional=frozenset(),
                       aggregation=aggregation,
                       auxiliary=frozenset(), caps=caps, grouped=False, groups=None,
                       offset=self.indices(plan.phases).level_two_offset(slot))


@dataclass
class RoundPlan:
    round_id: int
    epoch: int
    group: list[str]
    shares: list[float]
    me: str
    optional: frozenset[str] = frozenset()
    aggregation: AggregationSpec = field(default_factory=AggregationSpec)
    target_batch_size: int = 10**9  # a sender's claimed samples weigh at most a share of it
    compression: Codec = "none"  # of parts and results on the wire
    changes: RoundChanges = field(default_factory=RoundChanges)
    auxiliary: frozenset[str] = frozenset()  # members that reduce and bring no gradient
    pieces: int = 1  # parts per member's share: part j is member j // pieces's
    caps: dict[str, int] = field(default_factory=dict)  # the most samples a member's part counts for
    # Which all-reduce of the round this is (PowerSGD: 0 moves P, 1 moves Q) and how many the
    # round has. Part j of phase k travels, is committed and is checked as part
    # ``k * parts + j``: the two phases' frames, commitments and audits never meet.
    phase: int = 0
    phases: int = 1
    # A level of a grouped round (engine/averaging/grouped.py): its parts travel from
    # ``offset`` on, and a member's results carry the whole round's samples, not its group's.
    offset: int = 0
    grouped: bool = False
    # How results travel, if not as parts do: a grouped round's level-1 results are the
    # slot level 2 finished, and go back to the group in the bits it finished them in
    # (re-encoding a slot whose pieces were encoded apart would not give those bits back).
    results_codec: Codec | None = None
    groups: GroupedRound | None = None  # a grouped round, as the whole round runs

    @classmethod
    def of(cls, start: RoundStart, me: str, aggregation: AggregationSpec, target_batch_size: int,
           compression: CompressionMethod, changes: RoundChanges | None = None) -> RoundPlan:
        """The round the backbone opened, as ``me`` takes part in it; AveragingError if its
        phases would number more parts than the wire carries (the backbone opens none such)."""
        phases = 2 if compression == "powersgd" else 1
        grouped = GroupedRound.of(start.groups) if start.groups else None
        if grouped is not None and grouped.indices(phases).count > MAX_GROUP:
            raise AveragingError(f"round {start.round_id}: more than {MAX_GROUP} parts in its groups")
        if phases * len(start.group) * start.pieces > MAX_GROUP:
            raise AveragingError(f"round {start.round_id}: {phases} phases of more than "
                                 f"{MAX_GROUP // phases} parts each")
        return cls(start.round_id, start.epoch, start.group, start.shares, me, frozenset(start.optional),
                   aggregation, target_batch_size, codec_of(compression), changes or RoundChanges(),
                   frozenset(start.auxiliary), start.pieces,
                   dict(zip(start.group, start.caps, strict=True)) if start.caps else {},
                   phases=phases, groups=grouped)

    def phased(self, phase: int) -> RoundPlan:
        """This round's ``phase``-th all-reduce: the same members, shares and backbone's
        word on lost members (``changes`` is shared), its own part indices."""
        if not 0 <= phase < self.phases:
            raise ValueError(f"phase {phase} of a round of {self.phases}")
        return replace(self, phase=phase)

    def wire(self, j: int) -> int:
        """The index part ``j`` of this phase travels and is committed under."""
        return self.offset + self.phase * self.parts + j

    @property
    def result_compression(self) -> Codec:
        return self.compression if self.results_codec is None else self.results_codec

    @property
    def my_index(self) -> int:
        return self.group.index(self.me)

    @property
    def parts(self) -> int:
        return len(self.group) * self.pieces

    def owner(self, part: int) -> str:
        """The member a part was given to when the round opened."""
        return self.group[part // self.pieces]

    @property
    def senders(self) -> list[str]:
        """The members that bring a gradient, in group order."""
        return [p for p in self.group if p not in self.auxiliary]

    @property
    def verified(self) -> bool:
        """Whether reducers may be checked: then members commit to what they did."""
        return self.aggregation.verify_probability > 0
