"""Synchronous large-batch training: peers end up exactly where one machine would."""

import pytest
import torch

from engine.project import OptimizerSpec
from engine.tasks import create_task, initial_model
from engine.training.schedule import build_optimizer, lr_at
from tests.collab.harness import running_backbone, start_peer, stop_all, tiny_project

pytestmark = pytest.mark.slow


def reference_run(project, contributions):
    """One process taking the same large-batch steps on the same samples.

    ``contributions[e]`` lists the (seed, batch index) pairs every peer used in epoch e.
    """
    task = create_task(project.task, project.task_params)
    model = initial_model(task, project.seed)
    optimizer = build_optimizer(project.optimizer, model.parameters())
    for epoch, batches in enumerate(contributions):
        drawn = [task.batch(seed, index) for seed, index in batches]
        total = sum(b.size for b in drawn)
        for batch in drawn:
            (task.loss(model, batch) * batch.size / total).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), project.optimizer.clip_grad_norm)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(project.schedule, project.optimizer.lr, epoch)
        optimizer.step()
        optimizer.zero_grad()
    return model


async def test_three_peers_match_one_large_batch_process_and_each_other(tmp_path):
    # SGD with momentum: Adam divides by sqrt(v), which turns fp32 rounding noise on
    # parameters whose true gradient is zero (attention key biases) into full-size steps,
    # so even two single-process runs summing in different orders differ by ~lr there.
    project = tiny_project(optimizer=OptimizerSpec(name="sgd", lr=0.05, momentum=0.9, clip_grad_norm=1.0))
    epochs = 5
    async with running_backbone(tmp_path, project) as backbone:
        peers = [start_peer(backbone.url, project.id, f"p{i}", data_seed=100 + i, max_epochs=epochs)
                 for i in range(3)]
        try:
            for p in peers:
                assert await p.finish(timeout=120) == f"reached epoch {epochs}"
        finally:
            await stop_all(*peers)
        curve = backbone.store.curve(project.id)
        recorded = {e: backbone.store.epoch_state(project.id, e) for e in range(1, epochs + 1)}

    # Identity: after every epoch, every peer that took part holds the same parameters.
    by_epoch = {}
    for p in peers:
        for r in p.history:
            by_epoch.setdefault(r.step.epoch, set()).add(r.step.state_sha256)
    assert sorted(by_epoch) == list(range(1, epochs + 1))
    # All three averaged together from the second epoch on (the first may close while the
    # last of them is still starting), and none skipped a step and caught up by download.
    for p in peers:
        shared = {r.step.epoch for r in p.history if r.step.peers == 3}
        assert shared >= set(range(2, epochs + 1)), p.history
    assert all(hashes == {recorded[e]} for e, hashes in by_epoch.items()), (by_epoch, recorded)
    assert [point.epoch for point in curve] == list(range(1, epochs + 1))

    # Equivalence: the same steps on the same samples in one process.
    contributions = []
    for epoch in range(1, epochs + 1):
        batches = []
        for i, p in enumerate(peers):
            for r in p.history:
                if r.step.epoch == epoch:
                    batches += [(100 + i, index) for index in r.my_batches]
        (samples,) = {r.step.samples for p in peers for r in p.history if r.step.epoch == epoch}
        assert len(batches) * project.task_params["micro_batch"] == samples >= project.target_batch_size
        contributions.append(batches)
    reference = reference_run(project, contributions)
    for p in peers:
        for (name, mine), (_, theirs) in zip(p.peer.optimizer.model.state_dict().items(),
                                             reference.state_dict().items(), strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-7, msg=name)
