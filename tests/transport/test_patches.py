"""The patches to aioice, and the private parts of aioice and aiortc Cotrain reads, are checked
before they are used: a release that moved them stops Cotrain at start-up with their names."""

import aioice.ice
import aioice.turn
import pytest

from engine.transport.backends import aiortc_patches as patches


def test_the_installed_aioice_and_aiortc_have_everything_the_patches_touch():
    assert patches.problems() == []
    patches.apply()
    assert aioice.turn.UDP_SOCKET_BUFFER_SIZE >= patches.UDP_RECEIVE_BUFFER
    assert aioice.ice.Connection.query_consent is patches._query_consent


@pytest.mark.parametrize("where, name, replacement, named", [
    (aioice.ice.Connection, "query_consent", lambda self, extra: None, "query_consent"),
    (aioice.ice.Connection, "build_request", lambda self, pair: None, "build_request"),
    (aioice.ice, "get_host_addresses", lambda: [], "get_host_addresses"),
    (aioice.turn, "UDP_SOCKET_BUFFER_SIZE", "262144", "UDP_SOCKET_BUFFER_SIZE"),
    (aioice.ice.CandidatePair, "remote_addr", None, "remote_addr"),
])
def test_a_release_that_moved_something_is_refused_by_name(monkeypatch, where, name, replacement, named):
    monkeypatch.setattr(where, name, replacement)
    monkeypatch.setattr(patches, "_applied", False)
    with pytest.raises(patches.IncompatibleNetworkStack, match=named) as refused:
        patches.apply()
    assert "aioice" in str(refused.value) and "pyproject.toml" in str(refused.value)


def test_a_private_attribute_that_disappeared_is_refused(monkeypatch):
    real_init = aioice.ice.Connection.__init__

    def without_nominated(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        del self._nominated

    monkeypatch.setattr(aioice.ice.Connection, "__init__", without_nominated)
    assert any("_nominated" in problem for problem in patches.problems())
