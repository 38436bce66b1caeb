"""A peer that computes and reduces honestly but lies as a checker of other reducers: with
``--silent`` it never answers (before, a proven member that did so held the round for twice
the round's timeout, 240 s in demo-lm); without, it finds every part it checks wrong (before,
in a round of three voters, that discarded the round and expelled nobody). Started like
``cotrain peer`` (``python -m tests.hostile.dishonest_checker [--silent] peer ...``), from the
test's SIGUSR1 on (tests/hostile/wrong_reducer.py has the cue); it logs "lied as the checker
of part N of round R" or "kept silent on part N of round R"."""

import logging
import sys

from engine import cli
from engine.averaging.recheck import Verdict
from engine.peer.checking import Audits
from engine.wire.control import Audit
from tests.hostile import wrong_reducer

log = logging.getLogger("dishonest_checker")
honest_check = Audits._check
honest_verdict = Audits._verdict


async def silent(self: Audits, msg: Audit) -> None:
    if not wrong_reducer.cued:
        return await honest_check(self, msg)
    log.warning("kept silent on part %d of round %d", msg.index, msg.round_id)


async def lying(self: Audits, msg: Audit) -> Verdict:
    verdict = await honest_verdict(self, msg)
    if not wrong_reducer.cued or not verdict.ok:
        return verdict
    log.warning("lied as the checker of part %d of round %d", msg.index, msg.round_id)
    return Verdict(False, "its result is far from the average of its inputs")


if __name__ == "__main__":
    quiet = "--silent" in sys.argv
    if quiet:
        sys.argv.remove("--silent")
    wrong_reducer.install(lies=False)
    if quiet:
        Audits._check = silent  # type: ignore[method-assign]
    else:
        Audits._verdict = lying  # type: ignore[method-assign]
    cli.run()
