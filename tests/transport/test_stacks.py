"""Which stack a link runs on: native when both ends have it, a mixed pair when one does not,
and aiortc with one clear message when the native stack cannot run."""

import logging
import sys

import pytest

from engine.averaging.allreduce import round_key
from engine.transport import backends
from engine.wire.types import Transport
from tests.transport.mesh_pair import blob, make_meshes, transports


@pytest.fixture
def auto(monkeypatch):
    """Native where both ends have it: what COTRAIN_TRANSPORT=auto turns on."""
    if backends.native_problem():
        pytest.skip(f"native stack unavailable here: {backends.native_problem()}")
    monkeypatch.setenv(backends.ENV, backends.AUTO)


async def _exchange(meshes, sender, receiver, round_id):
    link = await meshes[sender].link(receiver)
    await link.send(blob(round_id), b"x" * 300_000)
    frame = await meshes[receiver].mailbox.get(round_key("part", round_id, 0, sender), timeout=20)
    assert bytes(frame.payload) == b"x" * 300_000
    return link


async def test_a_peer_without_the_native_stack_gets_a_mixed_pair_then_aiortc_at_both_ends(auto):
    meshes = make_meshes(["a", "b"])
    meshes["b"].transports = [Transport.AIORTC]
    try:
        link = await _exchange(meshes, "a", "b", 1)
        # a could not know: its first offer is native, and b answers on the stack it has.
        assert link.transport is Transport.NATIVE
        assert transports(meshes["b"]) == {"a": Transport.AIORTC}
        await link.close()
        again = await _exchange(meshes, "a", "b", 2)
        assert again.transport is Transport.AIORTC  # b's answer told a what it has
    finally:
        for mesh in meshes.values():
            await mesh.close()


async def test_two_peers_with_the_native_stack_use_it_whoever_offers(auto):
    meshes = make_meshes(["a", "b"])
    try:
        link = await _exchange(meshes, "b", "a", 1)
        assert link.transport is Transport.NATIVE
        assert transports(meshes["a"]) == {"b": Transport.NATIVE}
    finally:
        for mesh in meshes.values():
            await mesh.close()


@pytest.fixture
def native_broken(monkeypatch):
    """The native stack's import fails, as on a machine where wrtc is absent or broken."""
    monkeypatch.setitem(sys.modules, "webrtc", None)  # `import webrtc` raises ImportError
    monkeypatch.delitem(sys.modules, "engine.transport.backends.native_backend", raising=False)
    monkeypatch.setattr(backends, "_probed", False)
    monkeypatch.setattr(backends, "_native", None)
    monkeypatch.setattr(backends, "_native_problem", None)
    monkeypatch.setattr(backends, "_reported", False)
    monkeypatch.setenv(backends.ENV, backends.AUTO)


async def test_a_failed_native_import_falls_back_to_aiortc_with_one_clear_message(native_broken, caplog):
    caplog.set_level(logging.WARNING, logger="engine.transport.backends")
    meshes = make_meshes(["a", "b"])
    try:
        link = await _exchange(meshes, "a", "b", 1)
        assert link.transport is Transport.AIORTC
        assert meshes["a"].transports == [Transport.AIORTC] == backends.available()
    finally:
        for mesh in meshes.values():
            await mesh.close()
    messages = [r.getMessage() for r in caplog.records if "fast data channels unavailable" in r.getMessage()]
    assert len(messages) == 1, messages
    assert "import of webrtc" in messages[0] and "aiortc" in messages[0]


def test_forcing_a_native_stack_that_cannot_run_says_why(native_broken, monkeypatch):
    monkeypatch.setenv(backends.ENV, "native")
    with pytest.raises(backends.TransportUnavailable, match="import of webrtc"):
        backends.available()
    monkeypatch.setenv(backends.ENV, "quic")
    with pytest.raises(backends.TransportUnavailable, match="expected one of auto, native, aiortc"):
        backends.available()
