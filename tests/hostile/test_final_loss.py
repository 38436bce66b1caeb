"""Where training ends up with one hostile peer among four: the loss of the model at epoch
N, on fixed data, against the same three honest peers alone. Each run is a fresh
collaboration (a backbone and peers started as users start them, each honest peer with
its own fixed data); the final loss is that of the checkpoint of epoch N on held-out
batches -- not what members report, since a poisoner's parts carry a made-up loss.

The project uses ``centered_clip`` and checks each reducer's part with probability 1/2;
a wrong reducer is also run under ``mean``, where only the check stands in its way."""

from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine.project import AggregationSpec, ProjectSpec
from tests.hostile.adversary import Adversary, member
from tests.hostile.collaboration import Collaboration, HonestPeer, hostile_project
from tests.hostile.cued import cue, start_cued
from tests.hostile.poisoner import SAMPLES, Poisoner, flipped, left_out, nan, noise, scaled
from tests.hostile.wrong_reducer import lied

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EPOCHS = 60
PROBABILITY = 0.5
# A reducer that lies every time it reduces is missed k times in a row with probability
# (1 - p)^k: one in a thousand for this many.
CAUGHT_WITHIN = math.ceil(math.log(1e-3) / math.log(1 - PROBABILITY))
HELD_OUT = 16  # batches the final model is evaluated on
MARGIN = 0.05
STRANGER_ATTEMPTS = 2


def project(method: str) -> ProjectSpec:
    return hostile_project(checkpoint_every=EPOCHS, aggregation=AggregationSpec(
        method=method, verify_probability=PROBABILITY))


@dataclass
class Run:
    loss: float
    collab: Collaboration
    poisoned: int = 0  # parts the poisoner sent, if any
    left_out: int = 0  # ... that honest reducers logged leaving out
    credited: int = 0  # samples the ledger credits the poisoner
    harmless: int = 0  # rounds it sent honest-looking parts in, before it knew how to poison
    lies: list[int] = field(default_factory=list)  # rounds a wrong reducer lied in


async def run(root: Path, spec: ProjectSpec, attack: str | None = None) -> Run:
    """The collaboration trained to the epoch of its first checkpoint, and that checkpoint's loss.

    A stranger is in a round only when its Ready for the new epoch beats the honest peers'
    reports, one or two rounds of the sixty here: a run in which it got none proves nothing
    either way (CI saw one), and is run again, once."""
    for attempt in range(STRANGER_ATTEMPTS):
        done = await run_once(root / f"run-{attempt}", spec, attack)
        if done is not None:
            return done
    raise AssertionError(f"no poisoned part reached a reducer in {STRANGER_ATTEMPTS} runs: "
                         "the test proves nothing")


def judged(collab: Collaboration, liar: HonestPeer) -> bool:
    """Whether the backbone expelled the liar or stopped it reducing, or it lied so often
    that a verdict should have come."""
    backbone = collab.backbone.log.read_text(errors="replace")
    verdicts = "expelling it" in backbone or "reduces no part for" in backbone
    return verdicts or len(lied(liar.log.read_text(errors="replace"))) >= CAUGHT_WITHIN


async def run_once(root: Path, spec: ProjectSpec, attack: str | None) -> Run | None:
    """``run``'s collaboration; None if the stranger sent no poisoned part."""
    epochs = spec.checkpoint_every
    # Equal shares with a wrong reducer: the LP may give a peer no part (its link measured
    # slow), and one that reduces nothing cannot lie. The average is the same either way.
    collab = Collaboration(root, project=spec, backbone_args=("--equal-shares",) if attack in LIARS else ())
    collab.start_backbone()
    try:
        honest = [collab.start_peer(f"honest-{i}", "--data-seed", str(i)) for i in range(3)]
        liar = await start_cued(collab, LIARS[attack], honest) if attack in LIARS else None
        if liar is not None:
            await cue(collab, liar)
        checkpoint = lambda: collab.first_checkpoint(epochs) is not None  # noqa: E731
        if attack is None or liar is not None:
            await collab.until(checkpoint, 300, f"the checkpoint of epoch {epochs}")
        else:
            async with Adversary(collab.url, spec.id) as adversary:
                stranger = await adversary.join("poisoner")
                poisoner = Poisoner(adversary, stranger, POISONS[attack], collab.initial_gradient())
                task = asyncio.ensure_future(member(stranger, samples=SAMPLES))
                try:
                    await collab.until(checkpoint, 300, f"the checkpoint of epoch {epochs}")
                finally:
                    task.cancel()
                if not poisoner.sent:
                    return None
                return Run(loss_at_checkpoint(collab, epochs), collab, poisoner.sent,
                           left_out(collab, stranger.peer_id), collab.credited(adversary.peer_ids),
                           poisoner.harmless)
        if liar is not None:
            # Each lie is checked at p: the run goes on past the checkpoint until a check
            # reached a verdict on the liar, as it must within CAUGHT_WITHIN lies (but once
            # in a thousand runs): a run cut at the checkpoint left one in sixteen uncaught.
            await collab.until(lambda: judged(collab, liar), 300, "a check's verdict on the liar")
        lies = lied(liar.log.read_text(errors="replace")) if liar is not None else []
        assert liar is None or lies, "the liar never reduced a part: the test proves nothing"
        return Run(loss_at_checkpoint(collab, epochs), collab, lies=lies)
    finally:
        collab.stop()


def loss_at_checkpoint(collab: Collaboration, epochs: int) -> float:
    """The held-out loss of the first checkpoint from ``epochs`` on (a later one if its
    chore's peer was expelled before it uploaded)."""
    return collab.checkpoint_loss(collab.first_checkpoint(epochs) or epochs, HELD_OUT)


# The negated average said to come from 10^12 samples, values scaled to match (it passed
# every check before claims were capped: the stranger won 469 of 536 steps under mean).
SCALED = "10^12 samples claimed, values scaled"

# Wrong reducers: real peer processes whose reducer lies.
LIARS = {"a wrong reducer": "tests.hostile.wrong_reducer", "a wrong reducer that hides its inputs":
         "tests.hostile.hiding_reducer", "a wrong reducer that reconnects after each lie":
         "tests.hostile.reconnecting_liar", "a reducer that forges its own part":
         "tests.hostile.own_part_forger"}


POISONS = {"NaN parts": nan, "parts x(-1e4)": flipped, "noise 100x an honest gradient's length": noise(100.0),
           SCALED: scaled(10**12), "10^15 samples claimed, values scaled": scaled(10**15)}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> float:
    """The three honest peers alone (its figure is reported with every attack's)."""
    return asyncio.run(run(tmp_path_factory.mktemp("honest"), project("centered_clip"))).loss


@pytest.mark.parametrize("attack", [*POISONS, "a wrong reducer"])
async def test_with_centered_clip_one_hostile_peer_moves_the_final_loss_less_than_five_percent(
        tmp_path, baseline, report_figure, attack):
    attacked = await run(tmp_path, project("centered_clip"), attack)
    lies = f" (lied in {len(attacked.lies)} rounds)" if attack == "a wrong reducer" else ""
    report_figure(f"{attack}{lies}, centered_clip, epoch {EPOCHS}: held-out loss {attacked.loss:.4f} "
                  f"({attacked.loss / baseline - 1:+.1%} against three honest peers alone: {baseline:.4f})")
    assert attacked.loss <= baseline * (1 + MARGIN), (attacked.loss, baseline)


async def test_under_mean_a_claim_of_a_trillion_samples_scaled_to_match_moves_nothing(
        tmp_path, baseline, report_figure):
    attacked = await run(tmp_path, project("mean"), SCALED)
    report_figure(f"{SCALED}, mean, epoch {EPOCHS}: held-out loss {attacked.loss:.4f} "
                  f"({attacked.loss / baseline - 1:+.1%}); {attacked.poisoned} parts sent, "
                  f"{attacked.left_out} left out, {attacked.credited} samples credited (its "
                  f"{attacked.harmless} rounds of honest-looking parts claimed {SAMPLES} each)")
    assert attacked.left_out > 0 and attacked.credited <= attacked.harmless * SAMPLES
    assert attacked.loss <= baseline * (1 + MARGIN), (attacked.loss, baseline)


async def test_under_mean_a_wrong_reducer_is_caught_as_often_as_the_checks_predict(
        tmp_path, baseline, report_figure):
    attacked = await run(tmp_path, project("mean"), "a wrong reducer")
    collab = attacked.collab
    lies = attacked.lies
    caught = [line for line in collab.backbone.log.read_text(errors="replace").splitlines()
              if "is wrong" in line and "expelling it" in line]
    discarded = {int(line.split("round ")[1].split(":")[0]) for line in caught}
    kept = {e["round_id"] for p in collab.peers if p.name != "liar" for e in p.epochs}
    report_figure(f"a wrong reducer, mean, checks at p={PROBABILITY}: lied in {len(lies)} rounds, caught "
                  f"{len(caught)} time(s) and expelled ({CAUGHT_WITHIN} lies would go unseen one time in a "
                  f"thousand), {len(set(lies) & kept)} unchecked wrong steps kept; held-out loss "
                  f"{attacked.loss:.4f} ({attacked.loss / baseline - 1:+.1%})")
    assert len(caught) == 1 and len(lies) <= CAUGHT_WITHIN
    assert lies[-1] in discarded  # its last lie was the one caught: expelled, it reduced no more
    assert not discarded & kept, "an honest peer kept the step of a round found wrong"
    assert attacked.loss <= baseline * (1 + MARGIN), (attacked.loss, baseline)


async def test_under_mean_a_reducer_that_hides_its_inputs_has_no_checked_round_kept_and_reduces_no_more(
        tmp_path, baseline, report_figure):
    attacked = await run(tmp_path, project("mean"), "a wrong reducer that hides its inputs")
    collab = attacked.collab
    lies = attacked.lies
    backbone = collab.backbone.log.read_text(errors="replace").splitlines()
    unshown = {int(line.split("round ")[1].split(":")[0]) for line in backbone
               if "did not show its inputs" in line and "discarding the round" in line}
    demoted = [line for line in backbone if "reduces no part for" in line]
    expelled = [line for line in backbone if "expelling it" in line]
    kept = {e["round_id"] for p in collab.peers if p.name != "liar" for e in p.epochs}
    report_figure(f"a wrong reducer that hides its inputs, mean, checks at p={PROBABILITY}: lied in "
                  f"{len(lies)} rounds, {len(unshown)} discarded unchecked, reduced nothing {len(demoted)} "
                  f"time(s), expelled {len(expelled)} time(s), {len(set(lies) & kept)} unchecked wrong steps "
                  f"kept; held-out loss {attacked.loss:.4f} ({attacked.loss / baseline - 1:+.1%})")
    assert unshown and demoted
    assert len(lies) <= CAUGHT_WITHIN * len(demoted)  # each pause came within that many lies
    assert not unshown & kept, "an honest peer kept the step of a round nobody could check"
    assert not expelled  # not showing is no proof of a lie: it keeps training
    assert attacked.loss <= baseline * (1 + MARGIN), (attacked.loss, baseline)


def standing_credit(collab: Collaboration, name: str, rounds: list[int]) -> list[int]:
    """Those of ``rounds`` the ledger still credits the peer ``name`` for."""
    with collab.db() as db:
        (peer_id,) = db.execute("SELECT peer_id FROM peers WHERE name=?", (name,)).fetchone()
        return [r for (r,) in db.execute("SELECT round_id FROM contributions WHERE peer_id=? AND "
                                         "withdrawn_at IS NULL", (peer_id,)) if r in set(rounds)]


@pytest.mark.parametrize("attack, caught_as", [
    ("a wrong reducer that reconnects after each lie", "checkers found its result wrong"),
    ("a reducer that forges its own part", "another part of its own than it showed")])
async def test_under_mean_a_caught_reducer_stays_out_whatever_it_does_and_keeps_no_credit_of_its_lies(
        tmp_path, baseline, report_figure, attack, caught_as):
    """Before: a wrong reducer that reconnected 4 s after each lie came back a newcomer (lied
    7 times, expelled 3 times, 4 unchecked wrong steps kept), the credit of lies nobody
    checked stayed, and a reducer could pick its own input after seeing the others' -- then
    its -1x result rechecked as consistent."""
    attacked = await run(tmp_path, project("mean"), attack)
    collab, lies = attacked.collab, attacked.lies
    backbone = collab.backbone.log.read_text(errors="replace").splitlines()
    caught = [line for line in backbone if "is wrong" in line and "expelling it" in line]
    discarded = {int(line.split("round ")[1].split(":")[0]) for line in caught}
    kept = {e["round_id"] for p in collab.peers if p.name != "liar" for e in p.epochs}
    reconnects = collab.peers[0].log.read_text(errors="replace").count("reconnecting after round")
    standing = standing_credit(collab, "liar", lies)
    report_figure(f"{attack}, mean, checks at p={PROBABILITY}: lied in {len(lies)} rounds, reconnected "
                  f"{reconnects} times, caught {len(caught)} time(s), {len(set(lies) & kept)} unchecked "
                  f"wrong steps kept, {len(standing)} of them still credited; held-out loss "
                  f"{attacked.loss:.4f} ({attacked.loss / baseline - 1:+.1%})")
    assert len(caught) == 1 and caught_as in caught[0] and len(lies) <= CAUGHT_WITHIN
    assert lies[-1] in discarded  # expelled at its last lie: no reconnect brought it back
    assert not discarded & kept and not standing
    # The operator reads which rounds' steps came from its unchecked results.
    withdrawn = [line for line in backbone if "withdrew the" in line]
    named = {int(r) for line in withdrawn for found in re.findall(r": rounds ([\d, ]+)", line)
             for r in found.split(", ")}
    assert set(lies) & kept <= named, (withdrawn, lies, kept)
    assert attacked.loss <= baseline * (1 + MARGIN), (attacked.loss, baseline)
