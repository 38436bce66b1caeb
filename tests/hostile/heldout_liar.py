"""A stranger that lies about the held-out set: after every step it sends the backbone a
perfect score (loss 0.001, accuracy 1.0) for the settled state, chosen or not, hoping to
draw the project's learning curve. Otherwise an honest `cotrain peer`; it logs "claimed a
perfect score at epoch N"."""

import logging
import sys

from engine import cli
from engine.peer import rounds
from engine.wire.control import Evaluated, Step

log = logging.getLogger("heldout_liar")


async def claim_perfect(task, optimizer, send, step: Step) -> None:
    log.warning("claimed a perfect score at epoch %d", step.epoch)
    await send(Evaluated(epoch=step.epoch, state_sha256=step.state_sha256, loss=0.001,
                                     samples=10**6, accuracy=1.0))


rounds.evaluators = lambda trainers, epoch, every: list(trainers)  # it always thinks itself chosen
rounds.score_heldout = claim_perfect

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    cli.run(sys.argv[1:])
