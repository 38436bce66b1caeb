"""A peer's part in checking reducers (the rules: engine/averaging/recheck.py and
engine/backbone/tracker/checks.py). As a reducer, it keeps what it combined until its
round settles, and sends it to the checker the backbone names; as a checker, it combines
those inputs itself and reports whether the reducer's result follows from them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import msgspec
import torch

from engine.averaging.recheck import Verdict, recheck
from engine.averaging.tensor_parts import Reduced
from engine.peer.client import ControlClient
from engine.project import ProjectSpec, codec_of
from engine.transport.link import LinkClosed
from engine.transport.mailbox import Key, Mailbox
from engine.transport.mesh import PeerMesh
from engine.wire import ProtocolError
from engine.wire.commitments import Committed
from engine.wire.control import Audit, AuditDone
from engine.wire.frames import Input
from engine.wire.framing import Frame

log = logging.getLogger(__name__)


def input_key(index: int, position: int, round_id: int, reducer: str) -> Key:
    """Where the ``position``-th input of part ``index`` waits: a reducer may hold several
    parts of a round (pipelined in pieces), and one checker may be asked about more than one."""
    return Key("input", round_id, (index, position), reducer)


class AuditingPeer(Protocol):
    """What checking needs of the peer it runs in."""

    peer_id: str
    mailbox: Mailbox
    client: ControlClient
    spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task]

    @property
    def project(self) -> ProjectSpec: ...

    @property
    def mesh(self) -> PeerMesh: ...


class Audits:
    def __init__(self, peer: AuditingPeer) -> None:
        self.peer = peer
        self.kept: list[Reduced] = []

    def keep(self, reduced: list[Reduced]) -> None:
        """The parts we reduced in our last round: ours, and any we took over as a backup.
        A round that ends after a newer one (an auxiliary peer's, abandoned by the trainers)
        must not replace what the newer one kept: it may be checked."""
        if reduced and any(r.round_id > reduced[0].round_id for r in self.kept):
            return
        self.kept = list(reduced)

    def settled(self, round_id: int) -> None:
        """Rounds are checked before they settle: once ours has, nobody will ask."""
        self.kept = [r for r in self.kept if r.round_id > round_id]

    def on_audit(self, msg: Audit) -> None:
        me = self.peer.peer_id
        if msg.reducer == me:
            self.peer.spawn(self._send_inputs(msg))
        if msg.checker == me and msg.reducer != me:
            self.peer.spawn(self._check(msg))

    async def _send_inputs(self, msg: Audit) -> None:
        kept = next((r for r in self.kept if (r.round_id, r.index) == (msg.round_id, msg.index)), None)
        if kept is None:
            log.warning("asked to show part %d of round %d, which we no longer hold", msg.index, msg.round_id)
            return
        sent = [(position, committed, values) for position, (committed, values) in enumerate(kept.inputs)]
        sent.append((len(sent), Committed(sender=self.peer.peer_id, samples=0, sha256="0" * 64), kept.result))
        try:
            link = await self.peer.mesh.link(msg.checker, timeout=msg.timeout)
            for position, committed, values in sent:
                header = Input(round_id=msg.round_id, epoch=msg.epoch, index=msg.index, position=position,
                               sender=committed.sender, samples=committed.samples)
                await asyncio.wait_for(link.send(header, values.numpy().data), msg.timeout)
        except (LinkClosed, ProtocolError, asyncio.TimeoutError) as exc:
            log.warning("could not show part %d of round %d to %s: %s", msg.index, msg.round_id, msg.checker,
                        exc or "timeout")
            return
        log.info("showed part %d of round %d to %s, who checks it", msg.index, msg.round_id, msg.checker)

    async def _check(self, msg: Audit) -> None:
        verdict = await self._verdict(msg)
        if not verdict.ok:
            log.warning("part %d of round %d, reduced by %s, does not check out: %s", msg.index, msg.round_id,
                        msg.reducer, verdict.reason)
        done = AuditDone(round_id=msg.round_id, index=msg.index, ok=verdict.ok,
                         result_sha256=verdict.result_sha256, reason=verdict.reason or None,
                         unanswered=verdict.unanswered)
        await self.peer.client.send(done)

    async def _verdict(self, msg: Audit) -> Verdict:
        mailbox = self.peer.mailbox
        expected = [*msg.inputs, None]  # then the result
        keys = [input_key(msg.index, i, msg.round_id, msg.reducer) for i in range(len(expected))]
        waits = [asyncio.ensure_future(mailbox.get(key, msg.timeout)) for key in keys]
        try:
            frames = await asyncio.gather(*waits)
        except asyncio.TimeoutError:
            return Verdict(False, f"it did not send its inputs within {msg.timeout:.0f} s", unanswered=True)
        except (LinkClosed, ProtocolError) as exc:
            return Verdict(False, f"its link closed before it sent its inputs ({exc})", unanswered=True)
        finally:
            for wait in waits:
                wait.cancel()
        values: list[torch.Tensor] = []
        for position, (frame, committed) in enumerate(zip(frames, expected, strict=True)):
            reason = _wrong_input(frame, msg, position, committed)
            if reason:
                return Verdict(False, reason)
            values.append(torch.frombuffer(frame.payload, dtype=torch.float32))
        project = self.peer.project
        inputs = list(zip(msg.inputs, values[:-1], strict=True))
        caps = {c.sender: cap for c, cap in zip(msg.inputs, msg.caps, strict=True)} if msg.caps else None
        spec = project.aggregation
        if msg.group_sums:
            spec = msgspec.structs.replace(spec, max_sample_share=None)
        return await asyncio.to_thread(recheck, inputs, values[-1], msg.result_sha256, spec,
                                       project.target_batch_size, codec_of(project.compression), caps,
                                       msg.reducer if msg.judged else None, msg.forwarded, msg.pieces)


def _wrong_input(frame: Frame, msg: Audit, position: int, committed: Committed | None) -> str:
    """What is wrong with the frame the reducer sent for this place in the audit, if anything."""
    header = frame.header
    if not isinstance(header, Input) or (header.round_id, header.epoch, header.index) != (
            msg.round_id, msg.epoch, msg.index):
        return f"its input {position} is not for this audit"
    sender = committed.sender if committed is not None else msg.reducer
    if header.sender != sender or not frame.payload or len(frame.payload) % 4:
        return f"its input {position} is not the part of {sender}"
    return ""
