"""The backbone's disk, against `cotrain backbone` as its owner runs it. Before: a peer id that
never connected pulled the 40 MB checkpoint 100 times (4 GB in 7.7 s); partial uploads
(`.incoming-*`) outlived a crash; checkpoint files were 0644, and a data folder made looser
by hand (or by an older version) stayed so."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from engine.backbone.checkpoints import CheckpointFiles
from engine.backbone.rate_limits import LimitsConfig
from engine.wire import WIRE_VERSION
from engine.wire.rest import PEER_ID_HEADER, PEER_TOKEN_HEADER
from tests.hostile.adversary import Adversary, Stranger
from tests.hostile.collaboration import Collaboration

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

LIMITS = LimitsConfig()  # what `cotrain backbone` runs with
EPOCH = 3
CHECKPOINT = os.urandom(4 << 20)


def stored_checkpoint(collab: Collaboration) -> Path:
    """A checkpoint of EPOCH in the stopped backbone's data, as an upload would have left it
    (its contents are never checked on the way out)."""
    data = collab.root / "backbone"
    digest = hashlib.sha256(CHECKPOINT).hexdigest()
    path = CheckpointFiles(data / "checkpoints").path(digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(CHECKPOINT)
    with sqlite3.connect(data / "backbone.sqlite3") as db:
        db.execute("INSERT INTO checkpoints VALUES (?,?,?,?,?,?)",
                   (collab.project.id, EPOCH, digest, "0" * 64, len(CHECKPOINT), time.time()))
    return path


def restarted(collab: Collaboration) -> None:
    assert collab.backbone is not None
    collab.backbone.stop()
    collab.start_backbone()


@pytest.fixture
def backbone(tmp_path):
    collab = Collaboration(tmp_path, peers=0)
    try:
        collab.start_backbone()
        yield collab
    finally:
        collab.stop()


async def download(http: aiohttp.ClientSession, collab: Collaboration, peer_id: str, token: str) -> int:
    url = f"{collab.url}/api/projects/{collab.project.id}/checkpoints/{EPOCH}"
    async with http.get(url, headers={PEER_ID_HEADER: peer_id, PEER_TOKEN_HEADER: token}) as resp:
        body = await resp.read()
        if resp.status == 200:
            assert body == CHECKPOINT
        elif resp.status == 429:
            assert int(resp.headers["Retry-After"]) >= 1
        return resp.status


def downloads_of(http: aiohttp.ClientSession, collab: Collaboration, stranger: Stranger):
    return download(http, collab, stranger.peer_id, stranger.token)


async def test_checkpoints_go_to_connected_peers_a_few_times_a_minute(backbone, report_figure):
    stored_checkpoint(backbone)
    restarted(backbone)
    async with Adversary(backbone.url, backbone.project.id) as adversary:
        assert adversary.http is not None
        join = {"name": "never-connects", "wire": WIRE_VERSION}
        async with adversary.http.post(f"{backbone.url}/api/projects/{backbone.project.id}/peers",
                                       json=join) as resp:
            ghost = await resp.json()
        unconnected = [await download(adversary.http, backbone, ghost["peer_id"], ghost["token"])
                       for _ in range(20)]
        mallory = await adversary.join()
        one_peer = [await downloads_of(adversary.http, backbone, mallory) for _ in range(20)]
        sybils = [await adversary.join(f"sybil-{i}") for i in range(12)]
        one_address = [await downloads_of(adversary.http, backbone, s) for s in sybils for _ in range(3)]
    async with Adversary(backbone.url, backbone.project.id) as elsewhere:
        assert elsewhere.http is not None
        someone = await elsewhere.join("someone")
        theirs = await downloads_of(elsewhere.http, backbone, someone)
    served = (one_peer + one_address).count(200)
    report_figure(f"a peer that never connected: {dict(Counter(unconnected))}; one connected peer: "
                  f"{dict(Counter(one_peer))}; 12 more from its address: {dict(Counter(one_address))}; "
                  f"{served * len(CHECKPOINT) / 1e6:.0f} MB served to the address in all; another address: "
                  f"{theirs}")
    assert Counter(unconnected) == {409: 20}
    per_peer = int(LIMITS.checkpoint_downloads_per_peer.burst)
    assert Counter(one_peer) == {200: per_peer, 429: 20 - per_peer}
    # The address's budget, and what it refilled meanwhile (a download every 10 s).
    budget = LIMITS.checkpoint_downloads_per_address.burst
    assert budget <= served <= budget + 2
    assert theirs == 200


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_start_removes_half_written_uploads_and_makes_the_data_private_again(backbone):
    data = backbone.root / "backbone"
    checkpoint = stored_checkpoint(backbone)
    leftover = data / "checkpoints" / ".incoming-5d41402abc4b2a76b9719d911017c592"
    leftover.write_bytes(CHECKPOINT[: len(CHECKPOINT) // 3])  # a crash in mid-upload left this
    assert backbone.backbone is not None
    backbone.backbone.stop()
    files = [checkpoint, leftover, *data.glob("backbone.sqlite3*")]
    folders = [data, data / "checkpoints", checkpoint.parent]
    for path in files:
        path.chmod(0o644)
    for path in folders:
        path.chmod(0o755)
    backbone.start_backbone()
    assert not leftover.exists()
    assert checkpoint.read_bytes() == CHECKPOINT
    remaining = [p for p in files if p.exists()]
    assert {p.name: oct(mode(p)) for p in remaining} == {p.name: "0o600" for p in remaining}
    assert {str(p): oct(mode(p)) for p in folders} == {str(p): "0o700" for p in folders}
