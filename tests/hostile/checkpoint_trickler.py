"""A peer that computes honestly and says its uplink is the wire's fastest, like
tests/hostile/checkpoint_shirker.py, but keeps every checkpoint chore it is asked for: it
uploads the true state, at TRICKLE bytes a second. While the chore went to the fastest
claim, such a peer was asked for every checkpoint it was free for, and each took it ages.
Started like ``cotrain peer``; it logs "trickling the checkpoint of epoch N" each time."""

import logging

from engine import cli
from engine.peer import runner
from engine.peer.client import ControlClient
from tests.hostile.checkpoint_shirker import fastest

log = logging.getLogger("checkpoint_trickler")
honest_upload = ControlClient.upload_checkpoint
TRICKLE = 20_000.0


async def trickled_upload(self: ControlClient, epoch: int, data: bytes, state_sha256: str) -> None:
    log.warning("trickling the checkpoint of epoch %d", epoch)
    self.upload.set_rate(TRICKLE)
    await honest_upload(self, epoch, data, state_sha256)


if __name__ == "__main__":
    runner.reported_link = fastest  # type: ignore[assignment]
    ControlClient.upload_checkpoint = trickled_upload  # type: ignore[method-assign]
    cli.run()
