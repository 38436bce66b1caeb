"""A volunteer's worker follows an edit of its project: the backbone serves the new version
without a restart, the worker's peer joins it from the state it held (the epoch shown never
goes back, nothing is downloaded again from step 0), and the volunteer sees the new title,
with no problem reported."""

from __future__ import annotations

import json

import pytest

from engine.backbone import project_watch
from engine.worker import protocol as p
from engine.worker.session import Session
from tests.collab.harness import running_backbone
from tests.conftest import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def write(folder, title: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "project.json").write_text(json.dumps({
        "id": "edited", "title": title, "task": "demo-lm", "target_batch_size": 32, "round_timeout": 5,
        "task_params": {"layers": 1, "d_model": 32, "heads": 2, "ff": 64, "embedding": 16, "seq_len": 16,
                        "micro_batch": 8}}))


async def test_the_worker_joins_the_new_version_of_its_project_from_where_it_was(tmp_path, monkeypatch):
    monkeypatch.setattr(project_watch, "WATCH_INTERVAL", 0.2)
    write(tmp_path / "projects" / "edited", "First title")
    events: list[p.WorkerEvent] = []
    shown = lambda: [e.epoch for e in events if isinstance(e, p.Stats)]  # noqa: E731
    joined = lambda: [e.title for e in events if isinstance(e, p.ProjectJoined)]  # noqa: E731
    async with running_backbone(tmp_path / "bb", projects_dir=tmp_path / "projects") as backbone:
        session = Session(events.append, data_dir=tmp_path / "data")
        try:
            await session.start(p.Start(backbone=backbone.url, project="edited", name="here"))
            await until(lambda: max(shown(), default=0) >= 3, 90, "three steps")
            write(tmp_path / "projects" / "edited", "Second title")
            await until(lambda: len(joined()) >= 2, 60, "the worker to join the new version")
            edited_at = max(shown())
            await until(lambda: max(shown()) >= edited_at + 3, 60, "three steps of the new version")
        finally:
            await session.close()
    assert joined() == ["First title", "Second title"]
    epochs = shown()
    assert epochs == sorted(epochs), epochs  # (never back)
    assert not [e for e in events if isinstance(e, p.Problem)]
    assert [e.reason for e in events if isinstance(e, p.ProjectLeft)] == ["the worker is stopping"]
