"""A round as one member takes part in it: the one description every step of a round reads,
derived from the backbone's RoundStart by ``RoundPlan.of`` alone."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

import msgspec

from engine.averaging.errors import AveragingError
from engine.planning.grouped_indices import GroupedIndices
from engine.planning.slot_reducers import level_two_caps, slot_reducers_now
from engine.project import AggregationSpec, Codec, CompressionMethod, codec_of
from engine.wire.control import RoundStart
from engine.wire.groups import RoundGroups
from engine.wire.types import MAX_GROUP

log = logging.getLogger(__name__)


class Changes(Protocol):
    """The backbone's word on a round's members as the round goes, as a round (or one level
    of a grouped round) reads it."""

    @property
    def lost(self) -> frozenset[str]: ...

    @property
    def reducers(self) -> list[str] | None: ...

    async def wait(self) -> None: ...

    def watch(self, react: Callable[[], None]) -> None: ...


class RoundChanges:
    """The backbone's word on members lost midway through a round (control: Reassign), as
    it comes: whom to wait for no longer, and who reduces each part now."""

    def __init__(self) -> None:
        self.lost: frozenset[str] = frozenset()
        self.reducers: list[str] | None = None
        self._changed = asyncio.Event()
        self._watchers: list[Callable[[], None]] = []

    def update(self, lost: Iterable[str], reducers: list[str]) -> None:
        self.lost, self.reducers = frozenset(lost), list(reducers)
        for react in self._watchers:
            try:
                react()
            except Exception:  # (one round's bookkeeping must not keep the word from the rest)
                log.exception("reacting to the backbone's word on a round's members")
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait(self) -> None:
        """Until the next update."""
        await self._changed.wait()

    def watch(self, react: Callable[[], None]) -> None:
        """Call ``react`` on every update, before anyone waiting hears of it."""
        self._watchers.append(react)


class LevelChanges:
    """One level of a grouped round's view of the round's changes: the same lost members,
    and the reducers of this level's own parts."""

    def __init__(self, changes: Changes, reducers: Callable[[], list[str]]) -> None:
        self._changes, self._reducers = changes, reducers

    @property
    def lost(self) -> frozenset[str]:
        return self._changes.lost

    @property
    def reducers(self) -> list[str] | None:
        return None if self._changes.reducers is None else self._reducers()

    async def wait(self) -> None:
        await self._changes.wait()

    def watch(self, react: Callable[[], None]) -> None:
        self._changes.watch(react)


@dataclass(frozen=True)
class GroupedRound:
    """Who is in which group, who reduces which slot, and how large slots and pieces are
    (from a RoundStart's RoundGroups, which decoding checked)."""

    groups: list[list[str]]  # member ids, per group
    reducers: list[list[str]]  # per group, its reducer of each slot (slot k: the k-th)
    slot_shares: list[float]  # per slot, its share of the vector
    pieces: list[list[float]]  # per slot, per group: the share of the slot its reducer finishes

    @classmethod
    def of(cls, groups: RoundGroups) -> GroupedRound:
        return cls(groups.groups, groups.reducers, groups.slot_shares, groups.pieces)

    def group_of(self, member: str) -> int:
        return next(g for g, group in enumerate(self.groups) if member in group)

    def indices(self, phases: int) -> GroupedIndices:
        return GroupedIndices([len(g) for g in self.groups], len(self.slot_shares), phases)

    def now(self, plan: RoundPlan) -> list[list[str]]:
        """Each group's reducer of each slot now: a backup of the group's own takes a lost
        reducer's slot at both levels (the backbone's word, ``plan.changes``)."""
        return slot_reducers_now(self.groups, self.reducers, plan.group, plan.changes.reducers)

    # Both levels share the round's word on members lost midway (``RoundPlan.changes``): a
    # member that left is waited for no longer, and a lost slot reducer's backup takes its
    # slot in its group (level 1) and its place among the slot's reducers (level 2).

    def level_one(self, plan: RoundPlan) -> RoundPlan:
        """The round within our group: its slot reducers first, in slot order, so that slot
        k covers the same values in every group. Every part of the round travels, is
        committed and is checked under an index of its own (planning/grouped_indices.py)."""
        g = self.group_of(plan.me)
        reducers = self.reducers[g]
        members = reducers + [p for p in self.groups[g] if p not in reducers]
        shares = self.slot_shares + [0.0] * (len(members) - len(reducers))
        changes = LevelChanges(plan.changes, lambda: self.now(plan)[g] + members[len(reducers):])
        return replace(plan, group=members, shares=shares, pieces=1, grouped=True, groups=None,
                       results_codec="none", changes=changes,
                       offset=self.indices(plan.phases).level_one_offset(g),
                       optional=plan.optional & set(members), auxiliary=plan.auxiliary & set(members),
                       caps={p: c for p, c in plan.caps.items() if p in members})

    def level_two(self, plan: RoundPlan, slot: int) -> RoundPlan:
        """The round among the reducers of ``slot``, one per group, on their groups' sums. A
        backup that takes a lost reducer's slot stands in for it here: its part is the
        group's, and it finishes the lost one's piece (``stand_in``)."""
        def members() -> list[str]:
            return [reducers[slot] for reducers in self.now(plan)]

        def caps() -> dict[str, int]:
            return level_two_caps(self.groups, self.now(plan), plan.caps) if plan.caps else {}

        # (A group's sum weighs as the samples its members brought, within their caps: a share
        # of the target batch bounds one sender, not a group.)
        aggregation = msgspec.structs.replace(plan.aggregation, max_sample_share=None)
        two = replace(plan, group=members(), shares=self.pieces[slot], pieces=1, optional=frozenset(),
                      aggregation=aggregation, changes=LevelChanges(plan.changes, members),
                      auxiliary=frozenset(), caps=caps(), grouped=False, groups=None, stand_ins=True,
                      offset=self.indices(plan.phases).level_two_offset(slot))
        plan.changes.watch(lambda: stand_in(two, members(), caps()))
        return two


def stand_in(plan: RoundPlan, members: list[str], caps: dict[str, int]) -> None:
    """Backups in place of the lost members of a level-2 round (never in place of us: if
    the backbone lost us, our round fails on its own)."""
    for i, peer in enumerate(members):
        if plan.group[i] != peer and plan.group[i] != plan.me and peer not in plan.group:
            plan.group[i] = peer
    plan.caps.update(caps)


@dataclass
class RoundPlan:
    """A round as this member takes part in it: the RoundStart the backbone sent, read with
    the project's rules (aggregation, compression, target batch) and the changes the backbone
    announces while it runs (lost members, their stand-ins). Everything a round does is
    decided from it, the same on every member."""

    round_id: int
    epoch: int
    group: list[str]
    shares: list[float]
    me: str
    optional: frozenset[str] = frozenset()
    aggregation: AggregationSpec = field(default_factory=AggregationSpec)
    target_batch_size: int = 10**9  # a sender's claimed samples weigh at most a share of it
    compression: Codec = "none"  # of parts and results on the wire
    changes: Changes = field(default_factory=RoundChanges)
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
    # A grouped round's level 2: a backup may stand in for a lost member (``stand_in``).
    stand_ins: bool = False

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

    def share_of(self, index: int) -> float:
        """The share of its phase's vector the part travelling as ``index`` holds, as the
        backbone weighs its reducer (a flat round's part)."""
        return self.shares[(index - self.offset) % self.parts // self.pieces] / self.pieces

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
