"""How a link connects, read from the candidate pair ICE selected (the same on every stack)."""

import pytest

from engine.transport.connection import SelectedPair
from engine.wire.types import LinkPath


@pytest.mark.parametrize(("local", "remote", "path", "relayed_here"), [
    ("host", "host", LinkPath.HOST, False),
    ("srflx", "host", LinkPath.SRFLX, False),
    ("host", "prflx", LinkPath.SRFLX, False),
    ("relay", "host", LinkPath.RELAY, True),  # the other side answers directly: we needed our relay
    ("host", "relay", LinkPath.RELAY, None),  # our host candidate may sit behind a NAT
    ("relay", "srflx", LinkPath.RELAY, None),  # between two NATs: either end's relay would do
    ("prflx", "relay", LinkPath.RELAY, None),
    ("relay", "relay", LinkPath.RELAY, None),
])
def test_the_selected_pair_says_the_path_and_whether_only_our_relay_reaches_the_other_side(
        local, remote, path, relayed_here):
    pair = SelectedPair(local, remote)
    assert pair.path is path
    assert pair.relayed_here is relayed_here
