"""A newcomer downloads the training state from a peer the backbone names. Strangers that
joined first (so they are asked first) serve bad state: the settled state with one value
changed, with a zero-dimensional optimizer slot, with NaN in it, and bytes that are no state
file. Before, a donor's state was not checked (the hash left the optimizer state out, a 0-dim
exp_avg crashed the joiner, NaN was accepted). Now the joiner checks each against the
settled hash, tells the backbone who lied, and gets the state from an honest peer. (Whoever
joins after the liars is such a newcomer: the second honest peer often meets them first.)"""

import asyncio
import os

import pytest
import torch

from engine.training.state import pack, tensors_of
from engine.transport.link import LinkClosed
from engine.transport.mesh import PeerMesh
from engine.wire.control import RoundStart
from engine.wire.frames import StateReply, StateRequest, StateUnavailable
from engine.wire.framing import Frame
from engine.wire.tensors import decode_file, encode_file
from tests.hostile.adversary import Adversary, Stranger
from tests.hostile.collaboration import Collaboration
from tests.hostile.poisoner import send_member_parts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def one_value_changed(tensors: dict[str, torch.Tensor]) -> None:
    name = next(n for n in tensors if n.startswith("model/"))
    tensors[name].view(-1)[0] += 1.0


def zero_dimensional_slot(tensors: dict[str, torch.Tensor]) -> None:
    name = next(n for n in tensors if n.endswith("/exp_avg"))
    tensors[name] = torch.tensor(0.0)


def nan_in_a_slot(tensors: dict[str, torch.Tensor]) -> None:
    name = next(n for n in tensors if n.endswith("/exp_avg_sq"))
    tensors[name].fill_(float("nan"))


LIES = {"changed": one_value_changed, "zero-dim": zero_dimensional_slot, "nan": nan_in_a_slot,
        "garbage": None}


class Liar:
    """A stranger that serves, to whoever asks, a state it fetched from an honest peer and
    spoiled -- under the honest state's epoch and hash."""

    def __init__(self, adversary: Adversary, stranger: Stranger, lie: str) -> None:
        self.adversary, self.stranger, self.lie = adversary, stranger, lie
        self.fetched: dict[int, asyncio.Future[Frame]] = {}
        self.served: list[str] = []
        self.mesh: PeerMesh = adversary.mesh(stranger, self.on_frame)
        previous = stranger.on_message

        def on_message(msg) -> None:
            if previous is not None:
                previous(msg)
            if isinstance(msg, RoundStart) and stranger.peer_id in msg.group:
                # (else struck and left out of rounds before the joiner asks it)
                self.mesh.spawn(send_member_parts(self.mesh, stranger.peer_id, msg))

        stranger.on_message = on_message

    def on_frame(self, sender: str, frame: Frame) -> None:
        header = frame.header
        if isinstance(header, StateRequest):
            self.mesh.spawn(self.serve(sender, header.request_id))
        elif isinstance(header, (StateReply, StateUnavailable)) and header.request_id in self.fetched:
            self.fetched.pop(header.request_id).set_result(frame)

    def honest_peers(self) -> list[str]:
        members = {p for start in self.stranger.rounds() for p in start.group}
        return sorted(members - set(self.adversary.peer_ids))

    async def serve(self, joiner: str, request_id: int) -> None:
        for donor in self.honest_peers():
            if donor == joiner:
                continue
            future = self.fetched[request_id] = asyncio.get_running_loop().create_future()
            try:
                await (await self.mesh.link(donor, timeout=10)).send(StateRequest(request_id=request_id))
                honest = await asyncio.wait_for(future, 10)
            except (LinkClosed, asyncio.TimeoutError):
                continue
            header = honest.header
            if not isinstance(header, StateReply):
                continue  # busy serving another: ask the next
            await (await self.mesh.link(joiner, timeout=10)).send(header, self.spoil(honest.payload))
            self.served.append(joiner)
            return

    def spoil(self, data: bytes | bytearray) -> bytes:
        spoil = LIES[self.lie]
        if spoil is None:
            return os.urandom(len(data))
        state = decode_file(data)
        tensors = tensors_of(state)
        spoil(tensors)
        return encode_file(*pack(list(tensors.items()), state.meta))


async def test_a_joiner_refuses_bad_state_and_gets_the_settled_one(tmp_path, report_figure):
    collab = Collaboration(tmp_path, peers=2)
    try:
        collab.start_backbone()
        async with Adversary(collab.url, collab.project.id) as adversary:
            liars = [Liar(adversary, await adversary.join(f"liar-{lie}", follow=True), lie)
                     for lie in LIES]
            for name in collab.names:
                collab.start_peer(name)
            await collab.until(lambda: all(p.epoch >= 3 for p in collab.peers), 120,
                               "the honest peers at epoch 3")
            await collab.until(lambda: all(liar.honest_peers() for liar in liars), 60,
                               "the liars to see the honest peers in a round")
            began = asyncio.get_running_loop().time()
            joiner = collab.start_peer("joiner")
            await collab.until(lambda: len(joiner.epochs) >= 2, 180, "the joiner to take part in epochs")
            joined = asyncio.get_running_loop().time() - began
            fooled = [liar.lie for liar in liars if liar.served]
        assert collab.backbone is not None
        log = collab.backbone.log.read_text(errors="replace")
        said = "".join(p.log.read_text(errors="replace") for p in collab.peers)  # each one that joined

        def liars_where(text: str, line: str) -> set[str]:
            return {liar.lie for liar in liars if line.format(liar.stranger.peer_id) in text}

        refused = liars_where(said, "getting the state from {} failed")
        # Refused as not the settled state -- a lie proven -- rather than late (a liar that
        # relays slower than the joiner waits), which proves nothing against it.
        proven = liars_where(said, "getting the state from {} failed: refused the state")
        accused = liars_where(log, "says {} served bad state")
        gone = liars_where(log, "blames {} for bad state, not counted: it is no member now")
        report_figure(f"the joiner took part after {joined:.1f} s; liars that served it: {fooled}; "
                      f"proven lying: {sorted(proven)}; accused at the backbone: {sorted(accused)}")
        assert fooled, "no liar was asked: the test proves nothing"
        assert set(fooled) <= refused, "a peer took a liar's state"
        assert proven, "no lie was proven: the test proves nothing"
        assert proven - gone <= accused
        first = joiner.epochs[0]["epoch"]
        for epoch in range(first, joiner.epoch + 1):
            held = {p.name: e["state_sha256"] for p in collab.peers for e in p.epochs if e["epoch"] == epoch}
            assert len(set(held.values())) == 1 and "joiner" in held, (epoch, held)
        assert all(p.alive for p in collab.processes())
        assert collab.credited(adversary.peer_ids) == 0
    finally:
        collab.stop()
