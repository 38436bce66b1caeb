"""Hostile peers that are real peer processes (tests/hostile/wrong_reducer.py and those built
on it): in the collaboration from its first round whatever the machine's load, and turned
hostile on the test's cue."""

from __future__ import annotations

import signal
import sys

from tests.hostile.collaboration import Collaboration, HonestPeer

CUE_EPOCH = 3


async def start_cued(collab: Collaboration, module: str, *args: str, name: str = "liar") -> HonestPeer:
    """The hostile peer ``module``: it comes first, honest and at 1% of a CPU (so it seldom
    steps alone), and computes at full speed and turns hostile on ``cue``."""
    peer = collab.start_peer(name, "--data-seed", "3", "--cpu-percent", "1", *args,
                             command=[sys.executable, "-m", module])
    await collab.until(lambda: "in sync at epoch 0" in peer.log.read_text(errors="replace"), 120,
                       f"{name} in the collaboration")
    return peer


async def cue(collab: Collaboration, peer: HonestPeer, honest: list[HonestPeer]) -> None:
    """Once every honest peer holds the state, it computes at full speed: had it stepped alone
    before they came (on a loaded machine, CI saw it), it would be the only proven member, and
    its samples alone would open the rounds that prove the newcomers -- at 1% of a CPU, for
    minutes. Once every honest peer has taken part in rounds, it turns hostile in rounds with
    honest members, which can check it."""
    await collab.until(lambda: all("in sync at epoch" in p.log.read_text(errors="replace") for p in honest),
                       120, "every honest peer in sync")
    peer.popen.send_signal(signal.SIGUSR2)
    await collab.until(lambda: all(p.epoch >= CUE_EPOCH for p in honest), 120,
                       f"every honest peer at epoch {CUE_EPOCH}")
    peer.popen.send_signal(signal.SIGUSR1)
