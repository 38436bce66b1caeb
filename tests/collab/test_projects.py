"""Projects with data, as volunteers run them: peers fetching the catalog's albert-mini and
digits from the backbone that serves their folders."""

import asyncio

import pytest

from engine.project_folders import load_project_folder
from engine.shards.files import FolderFiles
from engine.tasks import TaskData, create_task, initial_model
from tests.collab.harness import running_backbone, start_peer, stop_all
from tests.collab.processes import spawn_peer
from tests.collab.test_digits import digits_folder, heldout_accuracy
from tests.projects import albert_folder, catalog_folder

pytestmark = pytest.mark.slow


def test_the_catalogs_projects_say_what_a_peer_needs_before_join(tmp_path):
    """The Projects page shows a project's memory before Join from its ``needs``: the
    catalog's folders carry them as `cotrain project check` would record them."""
    pytest.importorskip("sklearn", reason="the digits come from scikit-learn's bundled copy")
    for name in ("albert-mini", "digits"):
        folder = catalog_folder(tmp_path, name)
        needs = folder.spec.needs
        assert needs is not None, name
        task = create_task(folder.spec.task, folder.spec.task_params,
                           TaskData(folder.spec.data, FolderFiles(folder.root)))
        parameters = sum(p.numel() for p in initial_model(task, 0).parameters())
        assert needs.parameters == parameters, name
        # Weights, gradients and two Adam moments in fp32 at the least, activations besides.
        assert 16 * parameters < needs.memory_mb * 2**20 < 4 * 2**30, (name, needs)


async def test_two_peers_teach_the_digits_project_past_90_percent_held_out(tmp_path, monkeypatch,
                                                                           report_figure):
    monkeypatch.setenv("COTRAIN_HOME", str(tmp_path / "home"))  # the peers' shard cache
    folder = load_project_folder(digits_folder(tmp_path / "projects"))
    epochs = 40
    async with running_backbone(tmp_path / "bb", projects_dir=folder.root.parent) as backbone:
        peers = [start_peer(backbone.url, "digits", f"p{i}", max_epochs=epochs, threads=1) for i in range(2)]
        try:
            for p in peers:
                assert await p.finish(timeout=300) == f"reached epoch {epochs}"
        finally:
            await stop_all(*peers)
        curve = backbone.store.curve.points("digits")
    hashes: dict[int, set[str]] = {}
    for p in peers:
        for r in p.history:
            hashes.setdefault(r.step.epoch, set()).add(r.step.state_sha256)
    assert all(len(found) == 1 for found in hashes.values()), hashes  # batch norm included
    # Image steps take the target and not much more (issue 49 saw 0.75x-4.9x; with peers
    # held at the target, the others' counts fresh near it, 1.0x-1.19x, four in five within
    # a micro-batch per peer; each micro-batch asking once one has: 39 of 40, three runs).
    target = folder.spec.target_batch_size
    steps = {r.step.epoch: r.step.samples for p in peers for r in p.history}
    assert all(target <= n <= 1.5 * target for n in steps.values()), steps
    bound = target + len(peers) * folder.spec.task_params["micro_batch"]
    within = sum(n <= bound for n in steps.values())
    assert within >= 0.85 * len(steps), steps
    task = create_task("image-classification", dict(folder.spec.task_params),
                       TaskData(folder.spec.data, FolderFiles(folder.root)))
    model = initial_model(task, folder.spec.seed)  # without the stopped peer's compute gate
    model.load_state_dict(peers[0].peer.optimizer.model.state_dict())
    accuracy = heldout_accuracy(task, model)
    report_figure(f"digits, 2 peers, {epochs} steps of {folder.spec.target_batch_size}: "
                  f"held-out accuracy {accuracy:.1%}; {within} steps within a micro-batch per peer "
                  f"of the target, the most {max(steps.values())}")
    assert accuracy >= 0.9
    # The learning curve shows what the peers scored: every 10th state, the same figure.
    scored = {point.epoch: point.heldout_accuracy for point in curve if point.heldout_accuracy is not None}
    assert set(scored) >= {10, 20, 30}, scored
    assert scored[30] >= 0.85 and min(scored.values()) > 0.5, scored  # chance is 10%


@pytest.mark.parametrize(("change", "limit", "says"), [
    ({"task_params": {"model_type": "no-such-model"}}, [],
     "model type 'no-such-model' is not one this Cotrain builds"),
    ({"task_params": {"config": {"vocab_size": 8000, "trust_remote_code": True}}}, [],
     "asks for trust_remote_code: a project sends data, never code"),
    ({"task_params": {"config": {"vocab_size": 8000, "hidden_size": 2048, "intermediate_size": 8192,
                                 "num_attention_heads": 16}}}, ["--max-memory", "512"],
     "lets Cotrain use 512 MB"),
])
async def test_a_peer_told_to_build_what_cotrain_does_not_says_so_and_exits(tmp_path, change, limit, says):
    folder = albert_folder(tmp_path / "projects", **change)
    async with running_backbone(tmp_path / "bb", projects_dir=folder.root.parent) as backbone:
        peer = await spawn_peer(backbone.url, "albert-mini", "volunteer", tmp_path, *limit,
                                env={"COTRAIN_HOME": str(tmp_path / "home")})
        code = await asyncio.wait_for(peer.process.wait(), 120)
    log = (tmp_path / "volunteer.log").read_text()
    assert code == 1 and says in log and "Traceback" not in log, log[-2000:]
    assert not any(p.is_file() for p in (tmp_path / "home").rglob("*")), "nothing downloaded"
