"""Multi-process collaborations: what users run (`cotrain peer`, `cotrain demo`)."""

import asyncio
import re
import sys

import pytest

from engine.backbone.tracker import RecordCredits, RecordStep
from engine.paths import engine_command
from engine.wire.control import RoundStart
from tests.collab.harness import running_backbone, tiny_project
from tests.collab.processes import (
    kill_as_a_round_begins,
    settled_without_a_redo,
    spawn_peer,
    survivors_step,
    terminate,
)
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
        assert len(e["state_sha256"]) == 64 and e["round_seconds"] >= 0 and isinstance(e["loss"], float)
        # The round after the kill may have opened before the backbone noticed: the dead
        # member's samples died with it, and that one step takes the survivors' alone.
        assert e["samples"] >= project.target_batch_size or e["epoch"] == killed_at + 1, e
    after = [e for p in survivors for e in p.epochs if e["epoch"] > killed_at + 1]
    assert after and all(e["peers"] == 2 for e in after)
    assert len({e["state_sha256"] for e in after if e["epoch"] == killed_at + 2}) == 1


async def test_a_reducer_killed_mid_round_is_replaced_and_that_round_completes(tmp_path, report_figure):
    """SIGKILL a reducer as its round starts: the backbone hands its part to a backup, the
    others send that part again, and the same round settles (no redo) with every survivor
    on the same state; the dead peer is credited with nothing."""
    project = tiny_project(target_batch_size=96, round_timeout=30)
    async with running_backbone(tmp_path, project) as backbone:
        tracker = backbone.trackers[project.id]
        peers = [await spawn_peer(backbone.url, project.id, f"p{i}", tmp_path) for i in range(4)]
        seen: list[str] = []

        def a_reducer(start: RoundStart):
            """Whichever member the LP gave a part (on a loaded machine, a peer whose link
            measured slow may get none for a while)."""
            names = {p: s.name for p, s in tracker.peers.items()}
            reducers = [names.get(p) for p, share in zip(start.group, start.shares, strict=True)
                        if share > 0 and p not in start.optional]
            seen.append(f"epoch {start.epoch}: {len(start.group)} members, reducers {reducers}, "
                        f"peers' epochs {[p.epoch for p in peers]}")
            if len(start.group) < 4 or not all(p.epoch >= 2 for p in peers):
                return None
            return next((p for p in peers if p.name in reducers), None)

        # Its RoundStart is on its way: it dies holding a part to reduce.
        killed, recorded = kill_as_a_round_begins(backbone, a_reducer)
        try:
            try:
                await until(lambda: killed, 120, "a round with four peers")
            except AssertionError as e:
                raise AssertionError(f"{e}; the last rounds: {'; '.join(seen[-8:])}") from None
            start, victim = killed[0]
            survivors = await survivors_step(tracker, peers, start, victim, project.round_timeout)
        finally:
            await terminate(*peers)
    step, credited = settled_without_a_redo(recorded, start, survivors)
    assert tracker.backups.reassigned >= 1
    victim_id = next(p for p in start.group if p not in credited)
    assert len(credited) == 3 and victim_id not in credited
    report_figure(f"reducer killed as round {start.round_id} began: the round settled in "
                  f"{step.round_seconds:.1f} s (its timeout: {project.round_timeout} s), "
                  "one state on all 3 survivors")


async def test_an_auxiliary_peer_killed_as_its_round_begins_is_replaced_and_the_trainers_go_on(tmp_path):
    """`cotrain peer --aux` reduces for two trainers; SIGKILLed as a round it reduces in
    begins, its part goes to a trainer and that same round settles, with nothing credited
    to it."""
    project = tiny_project(target_batch_size=96, round_timeout=30)
    async with running_backbone(tmp_path, project) as backbone:
        tracker = backbone.trackers[project.id]
        trainers = [await spawn_peer(backbone.url, project.id, f"t{i}", tmp_path) for i in range(2)]
        helper = await spawn_peer(backbone.url, project.id, "helper", tmp_path, "--aux")
        killed, recorded = kill_as_a_round_begins(
            backbone, lambda start: helper if len(helper.epochs) >= 2 and start.auxiliary else None)
        try:
            await until(lambda: killed, 120, "two rounds the auxiliary peer reduced in, then a third")
            start, _ = killed[0]
            await until(lambda: tracker.epoch > start.epoch, project.round_timeout,
                        "the round the auxiliary peer died in to settle")
            for p in trainers:
                await p.reached(start.epoch + 2, timeout=60)
        finally:
            await terminate(*trainers, helper)
    # `cotrain peer --aux --json`: one object per round it reduced in.
    assert all({"aggregated", "round_id", "epoch", "senders", "seconds"} <= set(e) for e in helper.epochs)
    # A round may open while one trainer catches up on the state: then it had one sender.
    assert all(e["aggregated"] > 0 and e["senders"] in (1, 2) for e in helper.epochs)
    assert any(e["senders"] == 2 for e in helper.epochs)
    (step,) = [r.step for r in recorded if isinstance(r, RecordStep) and r.step.epoch == start.epoch + 1]
    assert step.round_id == start.round_id, "the round was redone"
    (credited,) = [r.credits for r in recorded
                   if isinstance(r, RecordCredits) and r.round_id == start.round_id]
    assert set(credited) == set(start.group) - set(start.auxiliary)
    hashes = {e["state_sha256"] for p in trainers for e in p.epochs if e["epoch"] == start.epoch + 1}
    assert hashes == {step.state_sha256}


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
