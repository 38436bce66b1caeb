"""Quitting at any moment ends the worker: Ctrl-C in the terminal or Quit in the app while
this computer's backbone is still starting. (Before: the peer started once the backbone was
up, after the quit, and nobody stopped it; the terminal's `cotrain` ignored Ctrl-C and held
the backbone's port, and CI's next test could not start a backbone there.)"""

from __future__ import annotations

import asyncio

import pytest

from engine.worker import protocol as p
from engine.worker.session import Session
from tests.collab.processes import write_catalog
from tests.conftest import until
from tests.hostile.collaboration import hostile_project

pytestmark = pytest.mark.slow


async def test_quitting_while_this_computers_backbone_starts_ends_the_session(tmp_path):
    events: list[p.WorkerEvent] = []
    session = Session(events.append, data_dir=tmp_path / "data",
                      catalog=write_catalog(tmp_path / "catalog.json", hostile_project()))
    real_host, hosting, release = session.host, asyncio.Event(), asyncio.Event()

    async def host_when_released() -> str:
        hosting.set()
        await release.wait()  # the user quits now, while the backbone starts
        return await real_host()

    session.host = host_when_released  # type: ignore[method-assign]
    await session.start(p.Start(backbone=p.LOCAL_BACKBONE, project="tiny-lm", name="here"))
    await asyncio.wait_for(hosting.wait(), 30)
    closing = asyncio.ensure_future(session.close())
    await until(lambda: session._leaving, 10, "the session to begin leaving")
    release.set()
    await asyncio.wait_for(closing, 30)
    assert session.peer is None and session.backbone is None
    assert not any(isinstance(e, p.ProjectJoined) for e in events)
    assert any(isinstance(e, p.ProjectLeft) for e in events)
