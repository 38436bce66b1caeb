"""Multi-process collaborations: what users run (`cotrain peer`, `cotrain demo`)."""

import asyncio
import re
import sys

import pytest

from engine.paths import engine_command
from tests.collab.harness import running_backbone, tiny_project
from tests.collab.processes import spawn_peer, terminate
from tests.conftest import until

pytestmark = pytest.mark.slow


async def test_killing_a_peer_between_rounds_lets_the_others_go_on(tmp_path):
    project = tiny_project(target_batch_size=96, round_timeout=10)
    async with running_backbone(tmp_path, project) as backbone:
        tracker = backbone.trackers[project.id]
        peers = [await spawn_peer(backbone.url, project.id, f"p{i}", tmp_path) for i in range(3)]
        try:
            await until(lambda: all(p.epoch >= 2 for p in peers) and tracker.round is None, 120,
                        "three peers past epoch 2, between rounds")
            victim, survivors = peers[0], peers[1:]
            victim.kill()
            await victim.process.wait()
            killed_at = tracker.epoch
            loop = asyncio.get_running_loop()
            began = loop.time()
            for p in survivors:
                await p.reached(killed_at + 2, timeout=60)
            assert loop.time() - began < 60
            await until(lambda: len(tracker.peers) == 2, 10, "the backbone to drop the killed peer")
        finally:
            await terminate(*peers)
    # `cotrain peer --json`: one object per completed epoch, with every documented field.
    for e in (e for p in peers for e in p.epochs):
        assert {"epoch", "loss", "samples", "peers", "state_sha256", "round_seconds", "averaging_seconds",
                "my_samples", "paths"} <= set(e)
        assert len(e["state_sha256"]) == 64 and e["samples"] >= project.target_batch_size
        assert e["round_seconds"] >= 0 and isinstance(e["loss"], float)
    after = [e for p in survivors for e in p.epochs if e["epoch"] > killed_at + 1]
    assert after and all(e["peers"] == 2 for e in after)
    assert len({e["state_sha256"] for e in after if e["epoch"] == killed_at + 2}) == 1


@pytest.mark.timeout(660)
async def test_cotrain_demo_trains_three_peers_to_identical_parameters():
    process = await asyncio.create_subprocess_exec(
        *engine_command(), "demo", "--peers", "3", "--epochs", "5",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 600)
    text = output.decode()
    sys.stdout.write(text[-2000:])
    assert process.returncode == 0, text[-3000:]
    summary = re.search(r"done: 5 epochs; loss ([\d.]+) -> ([\d.]+); all 3 peers hold identical "
                        r"parameters: yes", text)
    assert summary, text[-2000:]
    first, last = map(float, summary.groups())
    assert last < first - 0.5
