"""A wrong reducer (tests/hostile/wrong_reducer.py) that shows a checker nothing when its
part is drawn: it hopes a round nobody could check is kept, or that it is at least not
expelled as a reducer found wrong is. Started like ``cotrain peer``; it logs "hid part N
of round R" each time."""

import logging

from engine import cli
from engine.peer.checking import Audits
from engine.wire.control import Audit
from tests.hostile import wrong_reducer

log = logging.getLogger("hiding_reducer")
honest_show = Audits._send_inputs


async def hide(self: Audits, msg: Audit) -> None:
    if not wrong_reducer.cued:
        return await honest_show(self, msg)
    log.warning("hid part %d of round %d", msg.index, msg.round_id)


if __name__ == "__main__":
    wrong_reducer.install()
    Audits._send_inputs = hide  # type: ignore[method-assign]
    cli.run()
