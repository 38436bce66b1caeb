"""A peer that computes honestly -- so it is proven, and a voter the backbone may ask for a
checkpoint -- but says its uplink is the wire's fastest, which once bought it every
checkpoint chore, and breaks every upload it is asked for: it PUTs the headers of the
state the collaboration settled on over bytes that are no state at all, or (with
SHIRK=state in its environment) its true bytes under a state hash nobody settled on.
Started like ``cotrain peer``; it logs "broke the checkpoint of epoch N" each time."""

import logging
import os

from engine import cli
from engine.peer import runner
from engine.peer.client import ControlClient
from engine.wire.types import MAX_RATE

SHIRK = "SHIRK"  # "bytes" (the default) or "state"
log = logging.getLogger("checkpoint_shirker")
honest_upload = ControlClient.upload_checkpoint


def fastest(*_links) -> tuple[float, float]:
    return MAX_RATE, MAX_RATE


async def broken_upload(self: ControlClient, epoch: int, data: bytes, state_sha256: str) -> None:
    log.warning("broke the checkpoint of epoch %d", epoch)
    if os.environ.get(SHIRK) == "state":
        await honest_upload(self, epoch, data, "0" * 64)
    else:
        await honest_upload(self, epoch, bytes(len(data)), state_sha256)


if __name__ == "__main__":
    runner.reported_link = fastest  # type: ignore[assignment]
    ControlClient.upload_checkpoint = broken_upload  # type: ignore[method-assign]
    cli.run()
