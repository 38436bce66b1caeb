"""The governor's limits, enforced for real: CPU share, bandwidth, and pausing out of rounds."""

import asyncio

import psutil
import pytest

from engine.cli import build_parser, limits_from_args
from engine.peer.events import EpochCompleted, Synced, SyncProgress
from tests.collab.harness import MEDIUM, running_backbone, start_peer, stop_all, tiny_project
from tests.collab.processes import spawn_peer, terminate
from tests.conftest import until

pytestmark = pytest.mark.slow


def cli_limits(*flags: str):
    """Limits exactly as `cotrain peer` builds them from its flags."""
    args = build_parser().parse_args(["peer", "--backbone", "http://x", "--project", "p", *flags])
    return limits_from_args(args)


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


async def test_cpu_percent_50_uses_half_the_cpu_of_an_unthrottled_worker(tmp_path):
    free = tiny_project(id="free-lm", task_params=MEDIUM, target_batch_size=2000)
    half = tiny_project(id="half-lm", task_params=MEDIUM, target_batch_size=2000)
    async with running_backbone(tmp_path, free, half) as backbone:
        peers = [await spawn_peer(backbone.url, "free-lm", "free", tmp_path, "--normal-priority"),
                 await spawn_peer(backbone.url, "half-lm", "half", tmp_path, "--normal-priority",
                                  "--cpu-percent", "50")]
        try:
            for p in peers:
                await p.reached(1, timeout=120)
            procs = [psutil.Process(p.process.pid) for p in peers]
            before = [cpu_seconds(p) for p in procs]
            await asyncio.sleep(20)  # the measurement window itself, not synchronisation
            used = [cpu_seconds(p) - b for p, b in zip(procs, before, strict=True)]
        finally:
            await terminate(*peers)
    ratio = used[1] / used[0]
    assert used[0] > 12, used  # the unthrottled worker really kept a core busy
    assert 0.45 <= ratio <= 0.55, used


@pytest.mark.parametrize("side", ["upload", "download"])
async def test_a_state_transfer_keeps_to_2000_kbps(tmp_path, side):
    big = dict(MEDIUM, d_model=512, heads=8, ff=2048)  # 13 MB of parameters, 40 MB of state
    # One step alone takes the donor past epoch 0 (a seed every peer builds itself); the
    # next waits for the joiner's download.
    project = tiny_project(task_params=big, target_batch_size=8, round_timeout=60)
    capped = cli_limits(f"--max-{side}", "2000")
    async with running_backbone(tmp_path, project) as backbone:
        donor = start_peer(backbone.url, project.id, "donor",
                           limits=capped if side == "upload" else cli_limits())
        joiner = None
        try:
            await donor.reached(1, timeout=60)
            joiner = start_peer(backbone.url, project.id, "joiner",
                                limits=capped if side == "download" else cli_limits())
            await until(lambda: joiner.synced() or joiner.task.done(), 120, "the joiner to sync")
        finally:
            await stop_all(donor, *([joiner] if joiner else []))
    first_sync = joiner.events.index(joiner.synced()[0])
    progress = [(t, e) for t, e in zip(joiner.times[:first_sync], joiner.events[:first_sync], strict=True)
                if isinstance(e, SyncProgress) and e.total]
    assert joiner.synced()[0].source.startswith("peer") and progress[-1][1].total > 8_000_000
    # From a tenth of the transfer to its end: the steady rate, past connection set-up.
    (t0, start), (t1, end) = next(p for p in progress if p[1].received >= p[1].total / 10), progress[-1]
    rate = (end.received - start.received) / (t1 - t0)
    assert 1.8e6 <= rate <= 2.2e6, rate


async def test_a_paused_peer_leaves_rounds_and_matches_the_others_after_resuming(tmp_path):
    project = tiny_project()
    async with running_backbone(tmp_path, project) as backbone:
        peers = [start_peer(backbone.url, project.id, f"p{i}") for i in range(3)]
        resting = peers[2]
        try:
            await resting.reached(2, timeout=60)
            resting.peer.set_running(False, "Paused by you")
            paused_at = resting.history[-1].step.epoch
            await until(lambda: not resting.peer.optimizer.thread.busy, 5, "its compute to stop")
            events_at_pause = len(resting.events)
            received_at_pause = resting.peer.traffic().bytes_received
            for p in peers[:2]:
                await p.reached(paused_at + 3, timeout=60)
            assert resting.history[-1].step.epoch <= paused_at + 1  # at most the round under way
            # The machine stays its owner's: no state download while paused, only control
            # chatter and at most the round that was under way.
            while_paused = resting.events[events_at_pause:]
            assert not [e for e in while_paused if isinstance(e, (Synced, SyncProgress))]
            state_bytes = sum(t.numel() * t.element_size() for t in resting.peer.optimizer.model.parameters())
            assert resting.peer.traffic().bytes_received - received_at_pause < state_bytes
            resting.peer.set_running(True, "Contributing")
            resumed_at = peers[0].history[-1].step.epoch
            await resting.reached(resumed_at + 2, timeout=60)
        finally:
            await stop_all(*peers)
    during = [r for p in peers[:2] for r in p.history if paused_at + 1 < r.step.epoch <= resumed_at]
    assert during and all(r.step.peers == 2 for r in during)
    recorded = {r.step.epoch: r.step.state_sha256 for r in peers[0].history}
    after = [e for e in resting.events[resting.events.index(
        [e for e in resting.events if isinstance(e, Synced)][-1]):] if isinstance(e, EpochCompleted)]
    assert after and all(r.step.state_sha256 == recorded[r.step.epoch]
                         for r in after if r.step.epoch in recorded)
