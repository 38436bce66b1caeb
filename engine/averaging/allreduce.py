"""One butterfly all-reduce round over the peer mesh.

Every peer owns one contiguous part of the flat gradient. It sends part j of its
accumulated sum to peer j, reduces its own part from everyone's contributions, and sends
the averaged part back to all. Each part is reduced exactly once, so every peer (the
reducer included) applies the very same bits.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import torch

from engine.averaging.partition import part_bounds, weighted_average
from engine.transport.link import LinkClosed
from engine.transport.mesh import PeerMesh
from engine.wire import ProtocolError
from engine.wire.framing import Frame
from engine.wire.messages import Part, Result, from_wire, to_wire

log = logging.getLogger(__name__)


class AveragingError(RuntimeError):
    """The round could not complete on this peer (a peer vanished, a deadline passed).
    ``suspects``: the peers it could not exchange with, for the tracker to keep apart."""

    def __init__(self, message: str, suspects: set[str] | list[str] = ()) -> None:
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


def _as_floats(frame: Frame, expected: int, what: str) -> torch.Tensor | None:
    if frame.header.get("dtype") != "float32":
        raise ProtocolError(f"{what}: unsupported dtype {frame.header.get('dtype')!r}")
    if len(frame.payload) == 0:
        return None
    if len(frame.payload) != expected * 4:
        raise ProtocolError(f"{what}: {len(frame.payload)} bytes, expected {expected * 4}")
    return torch.frombuffer(frame.payload, dtype=torch.float32)


async def butterfly_allreduce(
    plan: RoundPlan,
    local_sum: torch.Tensor,
    samples: int,
    loss_sum: float,
    mesh: PeerMesh,
    timeout: float,
) -> Averaged:
    """Average ``local_sum`` (gradient x samples, flat fp32) with the group's; raise AveragingError."""
    waiting = _Waiting()
    try:
        return await asyncio.wait_for(
            _round(plan, local_sum, samples, loss_sum, mesh, waiting), timeout
        )
    except asyncio.TimeoutError:
        raise AveragingError(f"round {plan.round_id} did not finish within {timeout:.0f}s",
                             waiting.suspects()) from None
    except LinkClosed as exc:
        suspects = {exc.peer} if exc.peer else waiting.suspects()
        raise AveragingError(f"round {plan.round_id}: {exc}", suspects) from None
    except ProtocolError as exc:
        raise AveragingError(f"round {plan.round_id}: {exc}", waiting.suspects()) from None


@dataclass
class _Waiting:
    """Whom a round still waits for. A missing link or part points at that peer; a missing
    result does not: its reducer may itself be waiting on someone else, and blaming it would
    keep apart peers that reach each other fine (the reducer's own report names the culprit)."""

    links: set[str] = field(default_factory=set)
    parts: set[str] = field(default_factory=set)

    def suspects(self) -> set[str]:
        return self.links | self.parts


async def _round(
    plan: RoundPlan, local_sum: torch.Tensor, samples: int, loss_sum: float, mesh: PeerMesh,
    waiting: _Waiting,
) -> Averaged:
    me, group, rid = plan.my_index, plan.group, plan.round_id
    bounds = part_bounds(local_sum.numel(), plan.shares)
    others = [(j, p) for j, p in enumerate(group) if j != me]
    waiting.links = {p for _, p in others}

    async def connect(peer: str):
        link = await mesh.link(peer)
        waiting.links.discard(peer)
        return link

    links = dict(zip([p for _, p in others],
                     await asyncio.gather(*(connect(p) for _, p in others)), strict=True))
    waiting.parts = {p for _, p in others} if bounds[me][1] > bounds[me][0] else set()
    flat = local_sum.detach().contiguous().view(-1)

    async def send_part(j: int, peer: str) -> None:
        lo, hi = bounds[j]
        if hi == lo:
            return
        header = to_wire(Part(rid, plan.epoch, j, samples, loss_sum))
        payload = flat[lo:hi].numpy().data if samples > 0 else b""
        await links[peer].send(header, payload)

    async def receive_part(j: int, peer: str) -> tuple[torch.Tensor | None, int, float]:
        frame = await mesh.mailbox.get(("part", rid, peer), timeout=1e9)
        waiting.parts.discard(peer)
        part = from_wire(frame.header, {"part": Part})
        if part.epoch != plan.epoch or part.index != me:
            raise ProtocolError(f"part from {peer} is for epoch {part.epoch} index {part.index}")
        values = _as_floats(frame, bounds[me][1] - bounds[me][0], f"part from {peer}")
        if (values is None) != (part.samples == 0):
            raise ProtocolError(f"part from {peer} has samples={part.samples} but no values")
        return values, part.samples, part.loss_sum

    async def receive_result(j: int, peer: str) -> Result:
        frame = await mesh.mailbox.get(("result", rid, peer), timeout=1e9)
        result = from_wire(frame.header, {"result": Result})
        if result.epoch != plan.epoch or result.index != j:
            raise ProtocolError(f"result from {peer} is for epoch {result.epoch} index {result.index}")
        lo, hi = bounds[j]
        values = _as_floats(frame, hi - lo, f"result from {peer}")
        if values is None:
            raise ProtocolError(f"result from {peer} is empty")
        averaged[lo:hi] = values
        return result

    averaged = torch.empty_like(flat, dtype=torch.float32)
    my_lo, my_hi = bounds[me]
    results_task = asyncio.gather(
        *(receive_result(j, p) for j, p in others if bounds[j][1] > bounds[j][0])
    )
    sends = asyncio.gather(*(send_part(j, p) for j, p in others))
    try:
        mine: Result | None = None
        if my_hi > my_lo:
            received = await asyncio.gather(*(receive_part(j, p) for j, p in others))
            contributions = {j: r for (j, _), r in zip(others, received, strict=True)}
            local_part = flat[my_lo:my_hi] if samples > 0 else None
            contributions[me] = (local_part, samples, loss_sum)
            ordered = [contributions[j] for j in range(len(group))]
            total = sum(c[1] for c in ordered)
            reduced = weighted_average([c[0] for c in ordered], [c[1] for c in ordered])
            loss = sum(c[2] for c in ordered) / total
            averaged[my_lo:my_hi] = reduced
            received = {group[j]: c[1] for j, c in enumerate(ordered)}
            mine = Result(rid, plan.epoch, me, total, loss, received=received)
            header = to_wire(mine)
            payload = reduced.numpy().data
            await asyncio.gather(*(links[p].send(header, payload) for _, p in others))
        await sends
        results = list(await results_task)
    except BaseException:
        for task in (results_task, sends):
            task.cancel()
            task.add_done_callback(_quiet)
        raise
    if mine is not None:
        results.append(mine)
    if not results:
        raise AveragingError("nobody reduced anything")
    totals = {r.samples for r in results}
    if len(totals) != 1:
        raise ProtocolError(f"reducers disagree on the round's samples: {sorted(totals)}")
    return Averaged(averaged, results[0].samples, results[0].loss, _confirmed(group, results))


def _quiet(future: asyncio.Future) -> None:
    """Abandoned halves of a failed round: their errors are the round's, already reported."""
    if not future.cancelled():
        future.exception()


def _confirmed(group: list[str], results: list[Result]) -> dict[str, int]:
    """What every reducer confirms having received from each sender: the ledger's evidence."""
    confirmed = {}
    for sender in group:
        counts = [r.received.get(sender) for r in results]
        if all(c is not None for c in counts):
            confirmed[sender] = min(counts)  # type: ignore[type-var]
    return confirmed
