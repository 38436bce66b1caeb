"""What a member of a round commits to in its ``round_done`` before anyone knows which parts
will be checked (engine/backbone/tracker/checks.py): the parts it sent, the results it
applied and, as a reducer, every part it combined, each by its hash."""

from __future__ import annotations

import hashlib
from typing import Annotated

from msgspec import Meta, Struct, field

from engine.wire.types import MAX_GROUP, Count, PeerId, Sha256


class Committed(Struct, kw_only=True):
    """A part as its reducer took it: whose, how many samples it said it carried, its hash
    (``averaging/audit.part_digest``)."""

    sender: PeerId
    samples: Count
    sha256: Sha256


Digests = Annotated[list[Sha256 | None], Meta(max_length=MAX_GROUP)]  # by part index
# What a part with no samples is committed by (averaging/audit.part_digest of nothing).
EMPTY_PART = hashlib.sha256((0).to_bytes(8, "little")).hexdigest()


CommittedList = Annotated[list[Committed], Meta(max_length=MAX_GROUP)]


class PartInputs(Struct, kw_only=True):
    """As a reducer: what it combined for part ``index`` (one of its own, or one it took
    over as a backup; in a PowerSGD round, phase Q's part j is index ``parts + j``)."""

    index: Annotated[int, Meta(ge=0, lt=MAX_GROUP)]
    inputs: CommittedList


class Commitment(Struct, kw_only=True):
    """What a member of a round did, told before anyone knows which parts will be checked
    (see Audit): the hash of the part it sent each reducer, of each result it applied (by
    part index), and, as a reducer, of every part it combined. ``shown``: the hash of its
    own part that each reducer showed it (a ``shown`` frame) before it sent that reducer
    anything -- a reducer's own input is fixed before it sees anyone else's."""

    sent: Digests = field(default_factory=list)
    results: Digests = field(default_factory=list)
    reduced: Annotated[list[PartInputs], Meta(max_length=MAX_GROUP)] = field(default_factory=list)
    shown: Digests = field(default_factory=list)

    def inputs_of(self, index: int) -> list[Committed] | None:
        """What it combined for part ``index``, if it reduced that part."""
        return next((p.inputs for p in self.reduced if p.index == index), None)
