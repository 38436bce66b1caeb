"""Compressed rounds train as well as fp32 ones: three peers, each with its own fixed data,
trained to epoch N with each compression; the checkpoint of epoch N is evaluated on
held-out batches, and every peer's state hash agrees after every step."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.hostile.collaboration import Collaboration, hostile_project

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EPOCHS = 40
MARGIN = 0.02


async def trained(root: Path, compression: str) -> tuple[float, int]:
    """(held-out loss at epoch EPOCHS, epochs on which every peer's hash agreed)."""
    collab = Collaboration(root, project=hostile_project(checkpoint_every=EPOCHS, compression=compression))
    collab.start_backbone()
    try:
        for i in range(3):
            collab.start_peer(f"peer-{i}", "--data-seed", str(i))
        await collab.until(lambda: collab.has_checkpoint(EPOCHS), 300, f"the checkpoint of epoch {EPOCHS}")
        agreed = 0
        for epoch in range(1, EPOCHS + 1):
            hashes = collab.hashes(epoch)
            assert len(set(hashes.values())) <= 1, f"{compression}: peers differ after epoch {epoch}"
            agreed += len(hashes) == 3
        return collab.checkpoint_loss(EPOCHS), agreed
    finally:
        collab.stop()


def test_fp16_and_uint8_reach_the_loss_of_fp32_and_every_hash_agrees(tmp_path, report_figure):
    losses = {}
    for method in ("none", "fp16", "uint8"):
        (tmp_path / method).mkdir()
        losses[method], agreed = asyncio.run(trained(tmp_path / method, method))
        assert agreed >= EPOCHS // 2, f"{method}: only {agreed} epochs had all three peers"
    change = {m: 100 * (losses[m] / losses["none"] - 1) for m in ("fp16", "uint8")}
    report_figure(f"held-out loss at epoch {EPOCHS}: fp32 {losses['none']:.4f}, fp16 {losses['fp16']:.4f} "
                  f"({change['fp16']:+.2f}%), uint8 {losses['uint8']:.4f} ({change['uint8']:+.2f}%)")
    for method in ("fp16", "uint8"):
        assert losses[method] <= losses["none"] * (1 + MARGIN), losses
