"""A reducer that picks its own part after seeing everyone else's: it combines, as its own
input, what makes the result the *negated* average (target x total minus the others' parts)
and commits to that input as checking asks, so a recheck of its committed inputs finds its
result consistent. Before reducers showed their own part first, that passed every check.
Started like ``cotrain peer`` (``python -m tests.hostile.own_part_forger peer ...``); it
logs "lied in round N (forged its own part...)" each time, from the test's SIGUSR1 on (until then it
reduces honestly: tests/hostile/wrong_reducer.py has the cue)."""

import logging

import torch

from engine import cli
from engine.averaging import tensor_parts
from engine.averaging.robust import Contribution
from tests.hostile import wrong_reducer

log = logging.getLogger("own_part_forger")
honest_combine = wrong_reducer.honest_combine


def forged_combine(self, contributions):
    me = self.plan.me
    mine = next((c for c in contributions if c.sender == me), None)
    if wrong_reducer.cued and mine is not None and len(contributions) > 1:
        total = sum(c.samples for c in contributions)
        everyone = torch.stack([c.values for c in contributions]).sum(0)
        others = everyone - mine.values
        # (everyone's sum) / total is the average; this own part makes the sum its negation.
        forged = -everyone - others
        contributions = [c if c.sender != me else Contribution(me, forged, mine.samples)
                         for c in contributions]
        log.warning("lied in round %d (forged its own part; %d samples in all)", self.plan.round_id, total)
    return honest_combine(self, contributions)


if __name__ == "__main__":
    wrong_reducer.install()
    tensor_parts.TensorPartReducer.combine = forged_combine
    cli.run()
