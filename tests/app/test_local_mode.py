"""A project in local mode (DiLoCo), in the app with its real worker: the dashboard says
which mode the collaboration trains in and counts this computer's own steps between outer
steps, which go back to zero when the peers average."""

from __future__ import annotations

import pytest

from app.application import CotrainApp
from app.controller import Controller
from app.settings_store import Current, SettingsStore
from engine.project import LocalSpec
from tests.app.conftest import (
    TEST_LIMITS,
    WORKER_START,
    keyring_backend,
    private_home,
    stop_app,
    threaded_backbone,
    wait_until,
)
from tests.collab.harness import tiny_project
from tests.unit.test_credentials import memory_keyring

pytestmark = pytest.mark.timeout(120)


def inner_steps(text: str) -> int | None:
    marker = "Local updates (DiLoCo): "
    if not text.startswith(marker):
        return None
    return int(text[len(marker):].split(" ")[0].replace(",", ""))


def test_the_dashboard_shows_local_mode_and_the_inner_steps(qtbot, qapp, tmp_path, monkeypatch):
    project = tiny_project(mode="local", target_batch_size=96, local=LocalSpec(inner_batch_size=8),
                           checkpoint_every=1000)
    with keyring_backend(memory_keyring()), threaded_backbone(tmp_path / "backbone", project) as backbone:
        private_home(monkeypatch, tmp_path)
        store = SettingsStore()
        store.set_limits(TEST_LIMITS)
        store.add_backbone(backbone.url)
        store.set_current(Current(backbone.url, project.id))
        app = CotrainApp(Controller(store=store), tray=True)
        app.start()
        try:
            d = app.window.pages["dashboard"]
            wait_until(lambda: app.controller.state.kind == "contributing", WORKER_START,
                       "the app to contribute")
            wait_until(lambda: (inner_steps(d.mode.text()) or 0) >= 2, 30, "inner steps on the dashboard")
            assert "next outer step" in d.progress_title.text()
            assert "of 96 samples gathered by 1 peer" in d.progress_text.text()
            seen = [inner_steps(d.mode.text())]
            # About every 96 samples (12 inner steps of 8) an outer step starts the count again.
            wait_until(lambda: d.tiles["epoch"].text() not in ("–", "0"), 30, "an outer step")
            wait_until(lambda: seen.append(inner_steps(d.mode.text())) or seen[-1] < max(seen), 30,
                       "the count to start again after an outer step")
            # The Projects page says which mode each project trains in.
            app.window.show_page("projects")
            page = app.window.pages["projects"]
            def rows():
                return [page.tree.topLevelItem(i) for i in range(page.tree.topLevelItemCount())
                        if page.tree.topLevelItem(i).text(0).startswith(project.title)]

            wait_until(rows, 20, "the project in the list")
            assert "local updates (DiLoCo)" in rows()[0].text(2)
        finally:
            stop_app(app)
