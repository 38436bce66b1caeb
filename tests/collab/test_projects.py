"""Projects with data, as volunteers run them: `cotrain peer` processes fetching the
catalog's albert-mini from the backbone that serves its folder."""

import statistics

import pytest

from tests.collab.harness import running_backbone
from tests.collab.processes import spawn_peer, terminate
from tests.projects import albert_folder

pytestmark = pytest.mark.slow


async def test_three_peers_train_albert_mini_with_one_state_at_every_step(tmp_path, report_figure):
    # The catalog's albert-mini (ALBERT, whole-word masking, sentence order, its own tokenizer),
    # with a smaller global batch so that a test sees many steps.
    folder = albert_folder(tmp_path / "projects", target_batch_size=96, task_params={"seq_len": 64})
    epochs = 12
    async with running_backbone(tmp_path / "bb", projects_dir=folder.root.parent) as backbone:
        peers = [await spawn_peer(backbone.url, "albert-mini", f"p{i}", tmp_path, "--max-epochs", str(epochs),
                                  env={"COTRAIN_HOME": str(tmp_path / f"home{i}")})
                 for i in range(3)]
        try:
            for p in peers:
                await p.reached(epochs, timeout=300)
        finally:
            await terminate(*peers)
        recorded = {e: backbone.store.epoch_state("albert-mini", e) for e in range(1, epochs + 1)}
    hashes: dict[int, set[str]] = {}
    for p in peers:
        for line in p.epochs:
            hashes.setdefault(line["epoch"], set()).add(line["state_sha256"])
    assert all(found == {recorded[e]} for e, found in hashes.items()), hashes
    assert len(hashes) == epochs
    losses = [line["loss"] for line in sorted(peers[0].epochs, key=lambda line: line["epoch"])]
    first, last = statistics.mean(losses[:3]), statistics.mean(losses[-3:])
    report_figure(f"albert-mini, 3 peers: loss {first:.2f} over the first 3 steps, "
                  f"{last:.2f} over the last 3")
    assert last < first - 0.5
    for i in range(3):  # each peer fetched the shards it drew, into its own cache
        assert any((tmp_path / f"home{i}" / "shards").iterdir())
