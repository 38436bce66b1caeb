"""Hostile peers that are real peer processes (tests/hostile/wrong_reducer.py and those built
on it): they join a running collaboration, as a stranger does, and turn hostile on the
test's cue once their steps have settled beside the honest peers'."""

from __future__ import annotations

import signal
import sys

from tests.hostile.collaboration import Collaboration, HonestPeer

# Settled steps with its samples before the cue: its first proves it (its part was seen and
# its step agreed), so from the next it is a voter -- it reduces, votes and checks.
PROVEN_STEPS = 2


async def start_cued(collab: Collaboration, module: str, honest: list[HonestPeer], *args: str,
                     name: str = "liar") -> HonestPeer:
    """The hostile peer ``module``, started once every honest peer holds the state: the
    honest peers are then the collaboration's proven members, so the stranger never settles
    rounds alone. (Started first, on a loaded machine it stepped alone before they came, and
    as the only voter it settled its lies unchecked: CI saw 11 in a row.)"""
    await collab.until(lambda: all("in sync at epoch" in p.log.read_text(errors="replace") for p in honest),
                       120, "every honest peer in sync")
    return collab.start_peer(name, "--data-seed", "3", *args, command=[sys.executable, "-m", module])


async def cue(collab: Collaboration, peer: HonestPeer) -> None:
    """Once the hostile peer is a proven member, it turns hostile: in rounds with honest
    voters, which can check it."""
    await collab.until(lambda: sum(1 for e in peer.epochs if e.get("my_samples", 0) > 0) >= PROVEN_STEPS,
                       120, f"{peer.name} in {PROVEN_STEPS} settled steps")
    peer.popen.send_signal(signal.SIGUSR1)
