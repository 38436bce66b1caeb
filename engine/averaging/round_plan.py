"""A round as one member takes part in it: the one description every step of a round reads,
derived from the backbone's RoundStart by ``RoundPlan.of`` alone."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from engine.averaging.errors import AveragingError
from engine.project import AggregationSpec, Codec, CompressionMethod, codec_of
from engine.wire.control import RoundStart
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

    @classmethod
    def of(cls, start: RoundStart, me: str, aggregation: AggregationSpec, target_batch_size: int,
           compression: CompressionMethod, changes: RoundChanges | None = None) -> RoundPlan:
        """The round the backbone opened, as ``me`` takes part in it; AveragingError if its
        phases would number more parts than the wire carries (the backbone opens none such)."""
        phases = 2 if compression == "powersgd" else 1
        if phases * len(start.group) * start.pieces > MAX_GROUP:
            raise AveragingError(f"round {start.round_id}: {phases} phases of more than "
                                 f"{MAX_GROUP // phases} parts each")
        return cls(start.round_id, start.epoch, start.group, start.shares, me, frozenset(start.optional),
                   aggregation, target_batch_size, codec_of(compression), changes or RoundChanges(),
                   frozenset(start.auxiliary), start.pieces,
                   dict(zip(start.group, start.caps, strict=True)) if start.caps else {},
                   phases=phases)

    def phased(self, phase: int) -> RoundPlan:
        """This round's ``phase``-th all-reduce: the same members, shares and backbone's
        word on lost members (``changes`` is shared), its own part indices."""
        if not 0 <= phase < self.phases:
            raise ValueError(f"phase {phase} of a round of {self.phases}")
        return replace(self, phase=phase)

    def wire(self, j: int) -> int:
        """The index part ``j`` of this phase travels and is committed under."""
        return self.phase * self.parts + j

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
