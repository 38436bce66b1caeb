"""One butterfly all-reduce round over the peer mesh.

Every peer owns one contiguous share of the flat gradient, in ``pieces`` parts. It sends
each part of its accumulated sum to that part's reducer, reduces its own parts from
everyone's contributions, and sends each averaged part back to all as soon as it is done
(so results flow out while later parts still flow in). Each part is reduced exactly once,
so every peer (the reducer included) applies the very same bits.

Auxiliary members (``RoundPlan.auxiliary``: peers with bandwidth but no useful compute)
bring no gradient: they reduce their part (``aggregate_parts``) and take no step, so nobody
waits for a part from them or sends them results.

Members on probation (``RoundPlan.optional``: newcomers, or members that missed a round)
reduce nothing, and their parts are taken only if they come while the round lasts anyway:
a silent or slow stranger costs the others a short grace, never the round. A part that
breaks the rules is dropped and costs its sender its share, never the round. Nor does a
peer that reads slowly hold a reducer: results go out in the background, and the round
ends for the reducer a short grace after it holds every result.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import torch

from engine.aio import abandon, all_or_none
from engine.averaging.errors import AveragingError, Misbehaved
from engine.averaging.lost_members import LostMembers
from engine.averaging.reducer_sends import ReducerSends
from engine.averaging.round_plan import RoundPlan
from engine.averaging.stand_ins import FinishedParts
from engine.averaging.tensor_parts import (
    Averaged,
    Received,
    ReducedPart,
    ReducedParts,
    TensorPartContainer,
    TensorPartReducer,
    decode_values,
    outcome,
)
from engine.transport.link import LinkClosed, PeerLink
from engine.transport.mailbox import Key, Kind
from engine.transport.mesh import PeerMesh
from engine.wire.frames import Part, Result, Shown
from engine.wire.framing import Frame

log = logging.getLogger(__name__)

# Once the parts a reducer must have are in, optional parts still under way get as long
# again as the round took so far, at least this long: time enough for an honest newcomer
# on a link like the others', little for a silent one to cost. Results still being sent
# when the round is done get as long before the round returns (and go on after).
GRACE = 0.1
# What a reducer does with a part it reduced before the result goes out (a grouped round's
# level 1: the part is its group's, and the groups combine theirs first).
Finish = Callable[[int, ReducedPart], Awaitable[ReducedPart]]


async def butterfly_allreduce(
    plan: RoundPlan,
    local_sum: torch.Tensor,
    samples: int,
    loss_sum: float,
    mesh: PeerMesh,
    timeout: float,
    finish: Finish | None = None,
) -> Averaged:
    """Average ``local_sum`` (gradient x samples, flat fp32) with the group's; raise AveragingError."""
    parts = TensorPartContainer(plan, local_sum.detach().contiguous().view(-1), samples)
    runner = AllReduceRunner(plan, parts, loss_sum, mesh, timeout, finish)
    try:
        return await asyncio.wait_for(runner.run(), timeout)
    except asyncio.TimeoutError:
        raise AveragingError(f"round {plan.round_id} did not finish within {timeout:.0f}s",
                             runner.suspects(), runner.waiting()) from None
    except LinkClosed as exc:
        suspects = {exc.peer} if exc.peer else runner.suspects()
        raise AveragingError(f"round {plan.round_id}: {exc}", suspects, runner.waiting()) from None
    except Misbehaved as exc:
        raise AveragingError(f"round {plan.round_id}: {exc}", {exc.peer}, runner.waiting()) from None


async def aggregate_parts(plan: RoundPlan, numel: int, mesh: PeerMesh, timeout: float,
                          finish: Finish | None = None) -> ReducedParts:
    """As an auxiliary member of the round: reduce the parts of a ``numel``-element vector
    that are ours and send the results to everyone who brought a gradient; raise
    AveragingError."""
    runner = AllReduceRunner(plan, TensorPartContainer(plan, None, 0, numel), 0.0, mesh, timeout, finish)
    try:
        return await asyncio.wait_for(runner.run_auxiliary(), timeout)
    except asyncio.TimeoutError:
        raise AveragingError(f"round {plan.round_id} did not finish within {timeout:.0f}s",
                             runner.suspects()) from None
    except LinkClosed as exc:
        suspects = {exc.peer} if exc.peer else runner.suspects()
        raise AveragingError(f"round {plan.round_id}: {exc}", suspects) from None


@dataclass
class AllReduceRunner:
    """One round's protocol as this peer lives it: connect, send parts, reduce its own part
    (and any it takes over from a lost member), collect the others' results. Who sends what
    to whom, timeouts, lost members and backups live here; the tensors, in ``parts``
    (TensorPartContainer) and ``reducer`` (TensorPartReducer)."""

    plan: RoundPlan
    parts: TensorPartContainer
    loss_sum: float
    mesh: PeerMesh
    timeout: float
    finish: Finish | None = None
    links: dict[str, PeerLink] = field(default_factory=dict)
    # Whom the round still waits for. A missing link or part points at that peer; a missing
    # result does not: its reducer may itself be waiting on someone else, and blaming it would
    # keep apart peers that reach each other fine (the reducer's own report names the culprit).
    missing_links: set[str] = field(default_factory=set)
    missing_parts: dict[int, set[str]] = field(default_factory=dict)  # per part I reduce
    bytes_in: int = 0  # payload bytes of the parts I combined
    results_in: set[int] = field(default_factory=set)  # parts whose result we hold
    first_sent: float | None = None  # when our first part was handed to its link

    def __post_init__(self) -> None:
        plan, parts = self.plan, self.parts
        self.reducer = TensorPartReducer(plan)
        self.members = LostMembers(plan)
        self.sends = parts.sends
        share = [parts.member_size(m) for m in range(len(plan.group))]
        self.reduces = share[plan.my_index] > 0
        # Whom this peer exchanges with: the reducers (its parts out, results back) and, if
        # it reduces, every member that brings a gradient. Optional partners are never
        # waited for.
        self.partners = [p for m, p in enumerate(plan.group)
                         if p != plan.me and ((self.sends and share[m]) or
                                              (self.reduces and p not in plan.auxiliary))]
        self.required = [p for p in self.partners if p not in plan.optional]
        # A reducer's parts go to it in order, each whole before the next: it can reduce the
        # first while the others come (``send_part`` waits for its turn).
        self.turns = [asyncio.Event() for _ in range(plan.parts)]
        self.began = asyncio.get_running_loop().time()
        self.out = ReducerSends(plan, self.mesh, self.links, self.members, self.timeout)
        self.finished = FinishedParts(plan, self.mesh, self.members, self.out)

    def suspects(self) -> set[str]:
        missing = self.missing_links | self.members.closed | set().union(*self.missing_parts.values())
        return missing - self.members.lost

    def waiting(self) -> set[str]:
        """The reducers whose results we still lack (none: an auxiliary member needs none)."""
        if not self.sends:
            return set()
        reducers = self.members.reducers
        lacking = {reducers[j] for j in range(len(reducers))
                   if self.parts.size(j) and j not in self.results_in and reducers[j] != self.plan.me}
        return lacking - self.members.lost

    def ours(self, j: int) -> bool:
        """Whether part ``j`` was given to us when the round opened."""
        return self.plan.owner(j) == self.plan.me

    async def run_auxiliary(self) -> ReducedParts:
        """Reduce our parts (the backbone never hands an auxiliary member a lost one's)."""
        await self.connect()
        await all_or_none([self.reduce(j) for j in range(self.plan.parts)
                           if self.ours(j) and self.parts.size(j)])
        await self._results_sent()
        reducer = self.reducer
        return ReducedParts(reducer.mine, reducer.seen_in_all(), self.parts.commitment(reducer.reduced),
                            reducer.reduced, self.bytes_in)

    async def run(self) -> Averaged:
        await self.connect()
        results = await all_or_none([self.exchange(j) for j in range(self.plan.parts) if self.parts.size(j)])
        await self._results_sent()
        try:
            averaged = outcome(results, self.parts, self.reducer)
        except ValueError as exc:
            raise AveragingError(str(exc)) from None
        averaged.first_sent = self.first_sent
        return averaged

    async def _results_sent(self) -> None:
        await self.out.finish(GRACE)

    async def connect(self) -> None:
        self.missing_links = set(self.required)
        for j in range(self.plan.parts):  # a part nobody sends over a link is nobody's turn to wait on
            if not self.sends or self.ours(j) or not self.parts.size(j):
                self.turns[j].set()

        async def connect(peer: str) -> None:
            self.links[peer] = await self.mesh.link(peer)
            self.missing_links.discard(peer)

        waits = {p: asyncio.ensure_future(connect(p)) for p in self.required}
        try:
            await self.members.until_done(waits, self.required)
        finally:
            abandon(waits.values())

    async def exchange(self, j: int) -> Result:
        """Part ``j``: reduce it, if it is ours to; else send it to its reducer and take the
        result back -- from a backup, if the backbone hands the part to one meanwhile."""
        while True:
            reducer = self.members.reducers[j]
            if reducer == self.plan.me:
                self.turns[j].set()  # (a part handed to us: we do not send it)
                return await self.reduce(j)
            work = asyncio.ensure_future(self.send_and_receive(j, reducer))
            try:
                while True:
                    await self.members.any_or_news([work])
                    if work.done() and not (isinstance(work.exception(), LinkClosed)
                                            and await self.members.lost_soon(reducer)):
                        return work.result()
                    if self.members.reducers[j] != reducer:
                        log.info("round %d: part %d goes to %s now (%s left)", self.plan.round_id, j,
                                 self.members.reducers[j], reducer)
                        break
                    if reducer in self.members.lost:
                        raise AveragingError(f"round {self.plan.round_id}: {reducer} left, and nobody "
                                             f"took over part {j}")
            finally:
                abandon([work])

    async def send_and_receive(self, j: int, reducer: str) -> Result:
        link = self.links.get(reducer)
        if link is None:  # a backup we had no link to
            link = self.links[reducer] = await self.mesh.link(reducer)
        results = asyncio.ensure_future(self.receive_result(j, reducer))
        try:
            await self.send_part(j, link)
            return await results
        finally:
            abandon([results])

    async def send_part(self, j: int, link: PeerLink) -> None:
        parts = self.parts
        header = Part(round_id=self.plan.round_id, epoch=self.plan.epoch, index=self.plan.wire(j),
                      samples=parts.samples, loss_sum=self.loss_sum)
        try:
            compressed = self.plan.compression != "none"
            payload = await asyncio.to_thread(parts.payload, j) if compressed else parts.payload(j)
            if self.plan.verified:
                await asyncio.to_thread(parts.commit_sent, j, payload)
                # Nothing goes to a checked reducer before it has fixed its own part.
                parts.shown[j] = await self._shown(j, link.peer_id)
            if j % self.plan.pieces:
                await self.turns[j - 1].wait()  # the reducer's previous piece is on its way
            if self.first_sent is None:
                self.first_sent = time.monotonic()
            await link.send(header, payload)
        finally:
            self.turns[j].set()

    async def _shown(self, j: int, reducer: str) -> str:
        """The hash of its own part ``j`` that its reducer committed to."""
        index = self.plan.wire(j)
        key = round_key("shown", self.plan.round_id, index, reducer)
        frame = await self.mesh.mailbox.get(key, timeout=1e9)
        shown = frame.header
        if not isinstance(shown, Shown) or shown.epoch != self.plan.epoch or shown.index != index:
            raise Misbehaved(reducer, f"{reducer} showed its part {j} for another round")
        return shown.sha256

    async def _show_own(self, j: int) -> None:
        """As part ``j``'s reducer, in a checked project: commit to our own part to every
        sender before taking theirs (we cannot pick it once we know what they sent)."""
        digest = await asyncio.to_thread(self.parts.own_digest, j)
        self.out.to_senders(Shown(round_id=self.plan.round_id, epoch=self.plan.epoch, index=self.plan.wire(j),
                                  sha256=digest), b"")

    async def receive_part(self, j: int, peer: str) -> Received | None:
        """The part ``j`` that ``peer`` sent me, or None if it broke the rules (then it is left
        out, and so are its samples: it is the only one to pay)."""
        index = self.plan.wire(j)
        frame = await self.mesh.mailbox.get(round_key("part", self.plan.round_id, index, peer), timeout=1e9)
        self.missing_parts.get(j, set()).discard(peer)
        self.bytes_in += len(frame.payload)
        try:
            part = frame.header
            if not isinstance(part, Part) or part.epoch != self.plan.epoch or part.index != index:
                raise Misbehaved(peer, f"part from {peer} is not for this epoch's part {j}")
            values = await self._values(frame, j, peer, "part")
            if (values is None) != (part.samples == 0):
                raise Misbehaved(peer, f"part from {peer} has samples={part.samples} but no values")
        except Misbehaved as exc:
            log.warning("round %d: leaving out %s", self.plan.round_id, exc)
            return None
        return values, part.samples, part.loss_sum

    async def gather_parts(self, j: int) -> dict[str, Received]:
        """Every required sender's part ``j`` (a link lost fails the round, unless the
        backbone says its peer left), then what optional senders deliver within the grace.
        A lost member's part is left out: the round is the live members' -- and a backup's
        that stands in for it (a grouped round's level 2), waited for as it was."""
        waits: dict[str, asyncio.Future] = {}
        self.missing_parts[j] = set()
        try:
            while True:
                senders = [p for p in self.plan.senders if p != self.plan.me]
                required = [p for p in senders if p not in self.plan.optional]
                for p in senders:
                    if p not in waits:
                        waits[p] = asyncio.ensure_future(self.receive_part(j, p))
                        self.missing_parts[j] |= {p} & set(required)
                await self.members.until_done(waits, required)
                if senders == [p for p in self.plan.senders if p != self.plan.me]:
                    break
            optional = [w for p, w in waits.items() if p not in required and p not in self.members.lost]
            if optional:
                now = asyncio.get_running_loop().time()
                await asyncio.wait(optional, timeout=max(GRACE, now - self.began))
        finally:
            abandon(waits.values())
        arrived = {p: w.result() for p, w in waits.items()
                   if p in senders and p not in self.members.lost and w.done() and not w.cancelled()
                   and w.exception() is None}
        return {p: part for p, part in arrived.items() if part is not None}

    async def reduce(self, j: int) -> Result:
        """Reduce part ``j`` from the senders' parts and ours, and send the result to everyone."""
        if self.plan.verified:
            await self._show_own(j)
        gather = self.gather_parts(j)
        parts = await (self.finished.unless_finished(j, gather) if self.plan.stand_ins else gather)
        if self.sends:
            parts[self.plan.me] = (self.parts.own(j), self.parts.samples, self.loss_sum)
        try:
            # Off the event loop: CenteredClip of a large part takes seconds, and the links'
            # SCTP and DTLS run on this loop.
            done = await asyncio.to_thread(self._reduce, j, parts)
        except ValueError as exc:
            raise AveragingError(f"round {self.plan.round_id}: {exc}") from None
        if self.finish is not None:
            done = await self.finish(j, done)
            if self.sends:
                await asyncio.to_thread(self.parts.land, j, done.values)
        self.out.to_senders(done.result, done.payload)
        return done.result

    def _reduce(self, j: int, parts: dict[str, Received]) -> ReducedPart:
        """(On a thread.) The reduction, and its result applied here if we take the step
        (unless ``finish`` makes another result of it: then that one)."""
        done = self.reducer.reduce(j, parts)
        if self.sends and self.finish is None:
            self.parts.land(j, done.values)
        return done

    async def _values(self, frame: Frame, j: int, peer: str, what: str) -> torch.Tensor | None:
        """The fp32 values a part or result carries (None: an empty part)."""
        plan, expected = self.plan, self.parts.size(j)
        method = plan.result_compression if what == "result" else plan.compression
        try:
            if method == "none" or len(frame.payload) == 0:
                return decode_values(frame.payload, expected, method)
            return await asyncio.to_thread(decode_values, frame.payload, expected, method)
        except ValueError as exc:
            raise Misbehaved(peer, f"{what} from {peer}: {exc}") from None

    async def receive_result(self, j: int, peer: str) -> Result:
        index = self.plan.wire(j)
        frame = await self.mesh.mailbox.get(round_key("result", self.plan.round_id, index, peer), timeout=1e9)
        result = frame.header
        if not isinstance(result, Result) or result.epoch != self.plan.epoch or result.index != index:
            raise Misbehaved(peer, f"result from {peer} is not for this epoch's part {j}")
        values = await self._values(frame, j, peer, "result")
        if values is None:
            raise Misbehaved(peer, f"result from {peer} is empty")
        if self.plan.verified:
            await asyncio.to_thread(self.parts.land, j, values)
        else:
            self.parts.land(j, values)
        self.results_in.add(j)
        self.finished.received(j, peer, result, frame.payload)
        return result


def round_key(kind: Kind, round_id: int, index: int, sender: str) -> Key:
    """Where a part or result waits in the mailbox: per part, as a backup reducer gets two
    parts of one round from each sender (``index`` as it travels: RoundPlan.wire)."""
    return Key(kind, round_id, (index,), sender)
