"""The worker waits out what passes: this computer's backbone that cannot start (its data
folder unusable) is tried again, and said so, until it starts -- then the worker hosts and
joins without anyone asking again. (Before: "This computer -- starting…" stayed on the
Projects page forever, and a join that failed once was fatal.)"""

from __future__ import annotations

import pytest

from engine.worker import protocol as p
from engine.worker.session import Session
from tests.collab.processes import write_catalog
from tests.conftest import until
from tests.hostile.collaboration import hostile_project

pytestmark = pytest.mark.slow


async def test_a_local_backbone_that_cannot_start_is_tried_again_and_joined_once_it_can(tmp_path):
    events: list[p.WorkerEvent] = []
    blocked = tmp_path / "data" / "local-backbone"
    blocked.parent.mkdir()
    blocked.write_text("not a folder")  # where the backbone keeps its database
    session = Session(events.append, data_dir=tmp_path / "data",
                      catalog=write_catalog(tmp_path / "catalog.json", hostile_project()))
    try:
        await session.start(p.Start(backbone=p.LOCAL_BACKBONE, project="tiny-lm", name="here"))
        await until(lambda: any(isinstance(e, p.Problem) for e in events), 30, "the first problem")
        first = next(e for e in events if isinstance(e, p.Problem))
        assert first.hosting and not first.fatal and first.retry_in is not None
        assert first.message.startswith("This computer's backbone could not start")
        assert "Trying again in" in first.message
        blocked.unlink()
        await until(lambda: any(isinstance(e, p.ProjectJoined) for e in events), 60, "the worker to join")
        assert any(isinstance(e, p.Hosting) for e in events)
        assert not any(isinstance(e, p.Problem) and e.fatal for e in events)
    finally:
        await session.close()
