"""A stranger that poisons gradient values. It takes part in rounds but never computes: it
learns the scale of an honest gradient from the averaged results every member receives,
and sends its reducers parts made from them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from functools import partial

import torch

from engine.planning.partition import part_bounds
from engine.transport.link import LinkClosed
from engine.transport.mesh import PeerMesh
from engine.wire.control import RoundStart
from engine.wire.frames import Part, Result
from engine.wire.framing import Frame
from tests.hostile.adversary import Adversary, Stranger, member
from tests.hostile.attack_effect import RATE_FLOOR, assert_unharmed, under_attack
from tests.hostile.collaboration import Collaboration

SAMPLES = 32  # what the stranger says each part carries, unless it inflates it

Poison = Callable[[torch.Tensor], tuple[torch.Tensor, int]]  # honest-scale slice -> (gradient sum, samples)


def nan(honest: torch.Tensor) -> tuple[torch.Tensor, int]:
    values = honest * SAMPLES
    values[::7] = float("nan")
    return values, SAMPLES


def flipped(honest: torch.Tensor) -> tuple[torch.Tensor, int]:
    return honest * -1e4 * SAMPLES, SAMPLES


def noise(scale: float) -> Poison:
    def poison(honest: torch.Tensor) -> tuple[torch.Tensor, int]:
        values = torch.randn_like(honest)
        values *= scale * float(torch.linalg.vector_norm(honest)) / float(torch.linalg.vector_norm(values))
        return (honest + values) * SAMPLES, SAMPLES
    return poison


def inflated(honest: torch.Tensor) -> tuple[torch.Tensor, int]:
    """An honest-looking gradient sum, said to come from 10^12 samples."""
    return honest * SAMPLES, 10**12


def scaled(claim: int) -> Poison:
    """The negated average, said to come from ``claim`` samples, its values scaled to match:
    per sample it is as long as an honest gradient, so the norm check alone passes it. Before
    the backbone capped claims, 10^12 samples won 469 of 536 steps; 10^15 made honest
    reducers' results invalid (their sum of claims past the wire's limit)."""
    def poison(honest: torch.Tensor) -> tuple[torch.Tensor, int]:
        return honest * -float(claim), claim
    return poison


class Poisoner:
    """A member of rounds (it reports samples and follows every step) whose parts are
    ``poison`` applied to the last averaged result of the same slice."""

    def __init__(self, adversary: Adversary, stranger: Stranger, poison: Poison,
                 plausible: torch.Tensor | None = None) -> None:
        self.stranger, self.poison = stranger, poison
        self.plausible = plausible  # a per-sample gradient it computed from the project's spec, if any
        self.results: dict[int, torch.Tensor] = {}  # part index -> the last result for it
        self.sent = 0
        self.harmless = 0  # rounds it sent parts that pass as a member's
        self.mesh = adversary.mesh(stranger, self.on_frame)
        stranger.on_message = self.on_message_then(stranger.on_message)

    def on_frame(self, sender: str, frame: Frame) -> None:
        if isinstance(frame.header, Result) and frame.payload:
            self.results[frame.header.index] = torch.frombuffer(bytearray(frame.payload), dtype=torch.float32)

    def on_message_then(self, previous):
        def on_message(msg) -> None:
            if previous is not None:
                previous(msg)
            if isinstance(msg, RoundStart) and self.stranger.peer_id in msg.group:
                self.mesh.spawn(self.spoil(msg))
        return on_message

    async def send_harmless(self, start: RoundStart) -> None:
        """Parts that pass as a member's (send_member_parts)."""
        self.harmless += self.plausible is not None
        await send_member_parts(self.mesh, self.stranger.peer_id, start, self.plausible)

    async def spoil(self, start: RoundStart) -> None:
        total = sum(r.numel() for r in self.results.values())
        if not total or len(self.results) != sum(1 for s in start.shares if s > 0):
            # An honest gradient's scale is learnt from one round's results; until then it
            # sends parts that pass (a silent member is struck and sits rounds out, and would
            # poison nothing for a while).
            await self.send_harmless(start)
            return
        reference = torch.cat([self.results[j] for j in sorted(self.results)])
        bounds = part_bounds(total, start.shares)
        for j, ((lo, hi), member_id) in enumerate(zip(bounds, start.group, strict=True)):
            if hi == lo or member_id == self.stranger.peer_id:
                continue
            values, samples = self.poison(reference[lo:hi].clone())
            part = Part(round_id=start.round_id, epoch=start.epoch, index=j, samples=samples, loss_sum=0.0)
            with contextlib.suppress(LinkClosed, asyncio.TimeoutError):
                await (await self.mesh.link(member_id, timeout=5)).send(part, values.numpy().tobytes())
                self.sent += 1


def left_out(collab: Collaboration, peer_id: str) -> int:
    """How many times honest reducers logged leaving out this peer's part."""
    return sum(p.log.read_text(errors="replace").count(f"leaving out the part of {peer_id}")
               for p in collab.peers)


async def poisoned(collab: Collaboration, poison: Poison, report_figure, name: str,
                   may_earn: bool = False, stay: Callable[[Stranger], Awaitable[None]] | None = None,
                   rate_floor: float = RATE_FLOOR) -> tuple[int, int]:
    """Run the attack; returns (poisoned parts sent, parts honest reducers left out).
    ``stay``: how the poisoner stays a member (default: ``member``, reporting 32 samples)."""
    async with Adversary(collab.url, collab.project.id) as adversary:
        stranger = await adversary.join("poisoner")
        poisoner = Poisoner(adversary, stranger, poison)
        verdict = await under_attack(collab, lambda: (stay or partial(member, samples=SAMPLES))(stranger))
        refused = left_out(collab, stranger.peer_id)
        report_figure(f"{name}: {verdict.figure()}; {poisoner.sent} poisoned parts sent in "
                      f"{len(stranger.rounds())} rounds, {refused} left out by honest reducers, "
                      f"{collab.credited(adversary.peer_ids)} samples credited to it")
        assert poisoner.sent, "no poisoned part reached a reducer: the test proves nothing"
        assert_unharmed(collab, verdict, adversary.peer_ids, may_earn, rate_floor)
    return poisoner.sent, refused


async def send_member_parts(mesh: PeerMesh, me: str, start: RoundStart,
                            plausible: torch.Tensor | None = None) -> None:
    """Parts as a member of ``start`` sends them: slices of ``plausible`` (a per-sample
    gradient computed from the project's spec) if given, else empty ones, as a member that
    finished no micro-batch sends -- then it is struck for no samples, not for silence."""
    bounds = part_bounds(plausible.numel(), start.shares) if plausible is not None else None
    for j, (share, member_id) in enumerate(zip(start.shares, start.group, strict=True)):
        if share > 0 and member_id != me:
            values = b""
            if plausible is not None and bounds is not None:
                values = (plausible[bounds[j][0]:bounds[j][1]] * SAMPLES).numpy().tobytes()
            part = Part(round_id=start.round_id, epoch=start.epoch, index=j,
                        samples=SAMPLES if values else 0, loss_sum=0.0)
            with contextlib.suppress(LinkClosed, asyncio.TimeoutError):
                await (await mesh.link(member_id, timeout=5)).send(part, values)
