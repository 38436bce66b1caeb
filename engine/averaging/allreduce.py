"""One butterfly all-reduce round over the peer mesh.

Every peer owns one contiguous part of the flat gradient. It sends part j of its
accumulated sum to peer j, reduces its own part from everyone's contributions, and sends
the averaged part back to all. Each part is reduced exactly once, so every peer (the
reducer included) applies the very same bits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from engine.averaging.partition import part_bounds, weighted_average
from engine.transport.link import LinkClosed, PeerLink
from engine.transport.mesh import PeerMesh
from engine.wire import ProtocolError
from engine.wire.frames import Part, Result
from engine.wire.framing import Frame

log = logging.getLogger(__name__)


class AveragingError(RuntimeError):
    """The round could not complete on this peer (a peer vanished, a deadline passed).
    ``suspects``: the peers it could not exchange with, for the tracker to keep apart."""

    def __init__(self, message: str, suspects: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.suspects = sorted(suspects)


@dataclass
class RoundPlan:
    round_id: int
    epoch: int
    group: list[str]
    shares: list[float]
    me: str

    @property
    def my_index(self) -> int:
        return self.group.index(self.me)


@dataclass
class Averaged:
    vector: torch.Tensor
    samples: int
    loss: float | None
    confirmed: dict[str, int]  # sender -> samples that every reducer received from it


async def butterfly_allreduce(
    plan: RoundPlan,
    local_sum: torch.Tensor,
    samples: int,
    loss_sum: float,
    mesh: PeerMesh,
    timeout: float,
) -> Averaged:
    """Average ``local_sum`` (gradient x samples, flat fp32) with the group's; raise AveragingError."""
    round_ = _Round(plan, local_sum.detach().contiguous().view(-1), samples, loss_sum, mesh)
    try:
        return await asyncio.wait_for(round_.run(), timeout)
    except asyncio.TimeoutError:
        raise AveragingError(f"round {plan.round_id} did not finish within {timeout:.0f}s",
                             round_.suspects()) from None
    except LinkClosed as exc:
        suspects = {exc.peer} if exc.peer else round_.suspects()
        raise AveragingError(f"round {plan.round_id}: {exc}", suspects) from None
    except ProtocolError as exc:
        raise AveragingError(f"round {plan.round_id}: {exc}", round_.suspects()) from None


@dataclass
class _Round:
    """One round as this peer lives it: connect, send parts, reduce its own part, collect
    the others' results, check that the reducers agree."""

    plan: RoundPlan
    flat: torch.Tensor
    samples: int
    loss_sum: float
    mesh: PeerMesh
    links: dict[str, PeerLink] = field(default_factory=dict)
    # Whom the round still waits for. A missing link or part points at that peer; a missing
    # result does not: its reducer may itself be waiting on someone else, and blaming it would
    # keep apart peers that reach each other fine (the reducer's own report names the culprit).
    missing_links: set[str] = field(default_factory=set)
    missing_parts: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.bounds = part_bounds(self.flat.numel(), self.plan.shares)
        self.me = self.plan.my_index
        self.others = [(j, p) for j, p in enumerate(self.plan.group) if j != self.me]
        self.averaged = torch.empty_like(self.flat, dtype=torch.float32)

    def suspects(self) -> set[str]:
        return self.missing_links | self.missing_parts

    def size(self, j: int) -> int:
        lo, hi = self.bounds[j]
        return hi - lo

    async def run(self) -> Averaged:
        await self.connect()
        reducers = [(j, p) for j, p in self.others if self.size(j)]
        results = asyncio.gather(*(self.receive_result(j, p) for j, p in reducers))
        sends = asyncio.gather(*(self.send_part(j, p) for j, p in self.others))
        try:
            mine = await self.reduce_my_part() if self.size(self.me) else None
            await sends
            received = list(await results)
        except BaseException:
            for task in (results, sends):
                task.cancel()
                task.add_done_callback(_quiet)
            raise
        return self.outcome(received if mine is None else [*received, mine])

    async def connect(self) -> None:
        self.missing_links = {p for _, p in self.others}

        async def connect(peer: str) -> None:
            self.links[peer] = await self.mesh.link(peer)
            self.missing_links.discard(peer)

        await asyncio.gather(*(connect(p) for _, p in self.others))
        self.missing_parts = {p for _, p in self.others} if self.size(self.me) else set()

    async def send_part(self, j: int, peer: str) -> None:
        if not self.size(j):
            return
        lo, hi = self.bounds[j]
        header = Part(round_id=self.plan.round_id, epoch=self.plan.epoch, index=j, samples=self.samples,
                      loss_sum=self.loss_sum)
        payload = self.flat[lo:hi].numpy().data if self.samples > 0 else b""
        await self.links[peer].send(header, payload)

    async def receive_part(self, peer: str) -> tuple[torch.Tensor | None, int, float]:
        frame = await self.mesh.mailbox.get(("part", self.plan.round_id, peer), timeout=1e9)
        self.missing_parts.discard(peer)
        part = frame.header
        if not isinstance(part, Part) or part.epoch != self.plan.epoch or part.index != self.me:
            raise ProtocolError(f"part from {peer} is not for this epoch's part {self.me}")
        values = _as_floats(frame, self.size(self.me), f"part from {peer}")
        if (values is None) != (part.samples == 0):
            raise ProtocolError(f"part from {peer} has samples={part.samples} but no values")
        return values, part.samples, part.loss_sum

    async def reduce_my_part(self) -> Result:
        """Add everyone's part of mine in group order (so every reducer handed the same
        inputs gets the same bits), divide by the samples, send the result to everyone."""
        received = await asyncio.gather(*(self.receive_part(p) for _, p in self.others))
        lo, hi = self.bounds[self.me]
        contributions = dict(zip([j for j, _ in self.others], received, strict=True))
        contributions[self.me] = (self.flat[lo:hi] if self.samples > 0 else None, self.samples, self.loss_sum)
        ordered = [contributions[j] for j in range(len(self.plan.group))]
        total = sum(c[1] for c in ordered)
        reduced = weighted_average([c[0] for c in ordered], [c[1] for c in ordered])
        self.averaged[lo:hi] = reduced
        mine = Result(round_id=self.plan.round_id, epoch=self.plan.epoch, index=self.me, samples=total,
                      loss=sum(c[2] for c in ordered) / total,
                      received={self.plan.group[j]: c[1] for j, c in enumerate(ordered)})
        payload = reduced.numpy().data
        await asyncio.gather(*(self.links[p].send(mine, payload) for _, p in self.others))
        return mine

    async def receive_result(self, j: int, peer: str) -> Result:
        frame = await self.mesh.mailbox.get(("result", self.plan.round_id, peer), timeout=1e9)
        result = frame.header
        if not isinstance(result, Result) or result.epoch != self.plan.epoch or result.index != j:
            raise ProtocolError(f"result from {peer} is not for this epoch's part {j}")
        values = _as_floats(frame, self.size(j), f"result from {peer}")
        if values is None:
            raise ProtocolError(f"result from {peer} is empty")
        lo, hi = self.bounds[j]
        self.averaged[lo:hi] = values
        return result

    def outcome(self, results: list[Result]) -> Averaged:
        if not results:
            raise AveragingError("nobody reduced anything")
        totals = {r.samples for r in results}
        if len(totals) != 1:
            raise ProtocolError(f"reducers disagree on the round's samples: {sorted(totals)}")
        return Averaged(self.averaged, results[0].samples, results[0].loss,
                        _confirmed(self.plan.group, results))


def _as_floats(frame: Frame, expected: int, what: str) -> torch.Tensor | None:
    if len(frame.payload) == 0:
        return None
    if len(frame.payload) != expected * 4:
        raise ProtocolError(f"{what}: {len(frame.payload)} bytes, expected {expected * 4}")
    return torch.frombuffer(frame.payload, dtype=torch.float32)


def _quiet(future: asyncio.Future) -> None:
    """Abandoned halves of a failed round: their errors are the round's, already reported."""
    if not future.cancelled():
        future.exception()


def _confirmed(group: list[str], results: list[Result]) -> dict[str, int]:
    """What every reducer confirms having received from each sender: the ledger's evidence."""
    confirmed = {}
    for sender in group:
        counts = [r.received.get(sender) for r in results]
        present = [c for c in counts if c is not None]
        if len(present) == len(counts):
            confirmed[sender] = min(present)
    return confirmed
