"""Compressed rounds and mixed precision train as well as fp32 ones: three peers, each with
its own fixed data, trained to epoch N with each setting; the checkpoint of epoch N is
evaluated on held-out batches, and every peer's state hash agrees after every step."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engine.project import AggregationSpec
from tests.hostile.collaboration import Collaboration, hostile_project

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EPOCHS = 40
MARGIN = 0.02
JOINER_STEPS = 5
POWERSGD_MARGIN = 0.05  # rank 4 of a model whose matrices are 16-64 wide: a coarser step


async def trained(root: Path, joiner_at: int | None = None, **setting) -> tuple[float, int]:
    """(held-out loss at epoch EPOCHS, epochs on which every peer's hash agreed). With
    ``joiner_at``, a fourth peer joins once the others reach that epoch (it downloads the
    state) and must hold the same hash as they do at each of its first JOINER_STEPS steps,
    whenever they come."""
    collab = Collaboration(root, project=hostile_project(checkpoint_every=EPOCHS, **setting))
    collab.start_backbone()
    try:
        for i in range(3):
            collab.start_peer(f"peer-{i}", "--data-seed", str(i))
        if joiner_at is not None:
            await collab.until(lambda: collab.epoch >= joiner_at, 300, f"epoch {joiner_at}")
            collab.start_peer("joiner", "--data-seed", "3")
        await collab.until(lambda: collab.first_checkpoint(EPOCHS) is not None, 300,
                           f"the checkpoint of epoch {EPOCHS}")
        last = EPOCHS
        if joiner_at is not None:
            # Rounds may outrun a joiner's start on a busy machine: watch it for JOINER_STEPS
            # of its own, however late they come.
            await collab.until(lambda: len(joined(collab)) >= JOINER_STEPS, 300,
                               f"{JOINER_STEPS} steps of the joiner")
            last = max(EPOCHS, *joined(collab)[:JOINER_STEPS])
        agreed = 0
        for epoch in range(1, last + 1):
            hashes = collab.hashes(epoch)
            assert len(set(hashes.values())) <= 1, f"{setting}: peers differ after epoch {epoch}"
            agreed += epoch <= EPOCHS and len(hashes) >= 3
        return collab.checkpoint_loss(collab.first_checkpoint(EPOCHS) or EPOCHS), agreed
    finally:
        collab.stop()


def joined(collab: Collaboration) -> list[int]:
    """The epochs the joiner stepped in beside another peer (whose hash it must hold)."""
    return sorted(e for e in range(1, collab.epoch + 1) if "joiner" in (h := collab.hashes(e)) and len(h) > 1)


@pytest.fixture(scope="module")
def fp32_loss(tmp_path_factory) -> float:
    """The higher held-out loss of two fp32 runs: which peer's samples fill each step
    depends on timing, and two fp32 runs alone differed by 0.7% (3.0814, 3.1017), a third
    of the margin. A setting is held to fp32 as fp32 is to itself, then the margin."""
    losses = []
    for _ in range(2):
        loss, agreed = asyncio.run(trained(tmp_path_factory.mktemp("fp32")))
        assert agreed >= EPOCHS // 2, f"fp32: only {agreed} epochs had all three peers"
        losses.append(loss)
    return max(losses)


def test_fp16_and_uint8_reach_the_loss_of_fp32_and_every_hash_agrees(tmp_path, fp32_loss, report_figure):
    losses = {"none": fp32_loss}
    for method in ("fp16", "uint8"):
        (tmp_path / method).mkdir()
        losses[method], agreed = asyncio.run(trained(tmp_path / method, compression=method))
        assert agreed >= EPOCHS // 2, f"{method}: only {agreed} epochs had all three peers"
    change = {m: 100 * (losses[m] / losses["none"] - 1) for m in ("fp16", "uint8")}
    report_figure(f"held-out loss at epoch {EPOCHS}: fp32 {losses['none']:.4f}, fp16 {losses['fp16']:.4f} "
                  f"({change['fp16']:+.2f}%), uint8 {losses['uint8']:.4f} ({change['uint8']:+.2f}%)")
    for method in ("fp16", "uint8"):
        assert losses[method] <= losses["none"] * (1 + MARGIN), losses


def test_bf16_and_fp16_autocast_reach_the_loss_of_fp32_and_every_hash_agrees(tmp_path, fp32_loss,
                                                                             report_figure):
    """The forward and backward passes in bfloat16, or in float16 with a loss scaler; the
    average and the step stay fp32, so peers keep one state."""
    losses = {}
    for precision in ("bf16", "fp16"):
        (tmp_path / precision).mkdir()
        losses[precision], agreed = asyncio.run(trained(tmp_path / precision, precision=precision))
        assert agreed >= EPOCHS // 2, f"{precision}: only {agreed} epochs had all three peers"
    report_figure(f"held-out loss at epoch {EPOCHS}: fp32 {fp32_loss:.4f}, " + ", ".join(
        f"{p} autocast {loss:.4f} ({100 * (loss / fp32_loss - 1):+.2f}%)" for p, loss in losses.items()))
    assert all(loss <= fp32_loss * (1 + MARGIN) for loss in losses.values()), losses


def test_powersgd_with_checked_reducers_trains_near_fp32_and_a_joiner_takes_its_warm_start(
        tmp_path, fp32_loss, report_figure):
    """Rank 4 with error feedback, every part of both phases drawn for a check; a fourth
    peer joins at epoch 10 and downloads the state, warm Q included: its download is
    checked against the settled hash, which covers it, and its sketches start from the
    same Q as everyone's."""
    powersgd = dict(compression="powersgd", aggregation=AggregationSpec(verify_probability=1.0))
    loss, agreed = asyncio.run(trained(tmp_path, joiner_at=10, **powersgd))
    assert agreed >= EPOCHS // 2, f"powersgd: only {agreed} epochs had three peers or more"
    change = 100 * (loss / fp32_loss - 1)
    report_figure(f"held-out loss at epoch {EPOCHS}: fp32 {fp32_loss:.4f}, PowerSGD rank 4 with every part "
                  f"checked and a joiner at epoch 10 {loss:.4f} ({change:+.2f}%)")
    assert loss <= fp32_loss * (1 + POWERSGD_MARGIN), (loss, fp32_loss)
