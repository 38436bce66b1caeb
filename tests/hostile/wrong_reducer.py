"""A peer that computes honestly -- so it is proven and reduces a part of every round --
but returns a wrong average for its part: the average x(-3). It sends that result to every
member and applies it itself, so every hash agrees; it even commits to it, as checking
asks. Started like ``cotrain peer`` (``python -m tests.hostile.wrong_reducer peer ...``);
it logs "lied in round N" each time. In a PowerSGD project, with LIE_PHASE set (0: phase P,
1: phase Q) in its environment, it lies in that phase's parts only, and logs "lied in round
N, phase K".

Until the test's SIGUSR1 (tests/hostile/cued.py: once its steps have settled beside the
honest peers', so it reduces in rounds they check) it reduces honestly."""

import logging
import os
import signal

from engine import cli
from engine.averaging import tensor_parts

log = logging.getLogger("wrong_reducer")
honest_combine = tensor_parts.TensorPartReducer.combine
cued = False  # lying, from the test's SIGUSR1 on
LIE_PHASE = "LIE_PHASE"  # (environment) the one PowerSGD phase it lies in


def wrong_combine(self, contributions):
    combined, inputs = honest_combine(self, contributions)
    phase = os.environ.get(LIE_PHASE)
    if cued and (phase is None or int(phase) == self.plan.phase):
        combined.values.mul_(-3.0)  # what it sends, keeps for a checker and commits to
        log.warning("lied in round %d, phase %d", self.plan.round_id, self.plan.phase)
    return combined, inputs


def cue(signum, frame) -> None:
    global cued
    cued = True
    log.warning("lying from now on")


def lied(log_text: str) -> list[int]:
    """The rounds a wrong reducer's log says it lied in."""
    return [int(line.split("lied in round ", 1)[1].split()[0].rstrip(",")) for line in log_text.splitlines()
            if "lied in round " in line]


def install(lies: bool = True) -> None:
    """The cue for peers of tests/hostile; with ``lies``, this reducer's lie."""
    if lies:
        tensor_parts.TensorPartReducer.combine = wrong_combine
    signal.signal(signal.SIGUSR1, cue)


if __name__ == "__main__":
    install()
    cli.run()
