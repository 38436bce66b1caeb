"""Pages and pieces that need no worker: settings kept across runs, start at login, adding a
backbone, the window without a tray, the no-keyring fallback, one instance per user, and
the worker protocol (including a real worker refusing a bad line)."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import msgspec
import pytest
from keyring.backends import null

from app import autostart, backbone_calls
from app.backbone_calls import BackboneCalls
from app.controller import Controller
from app.instance import InstanceServer, ask_running_instance
from app.settings_store import Current, SettingsStore
from app.views.account import AccountPage
from app.views.dashboard import DashboardPage
from app.views.projects import ProjectsPage
from app.views.settings import SettingsPage
from app.window import MainWindow
from engine.governor.limits import Limits
from engine.governor.policy import GovernorState
from engine.paths import engine_command
from engine.project import DataSpec, FileRef, ProjectNeeds
from engine.wire import ProtocolError
from engine.worker import protocol as p
from tests.app.conftest import keyring_backend, threaded_backbone, tiny, wait_until

pytestmark = pytest.mark.timeout(60)


def test_settings_are_kept_across_runs(home):
    store = SettingsStore()
    assert store.first_run and store.current() == Current(p.LOCAL_BACKBONE, "demo-lm")
    limits = Limits(threads=1, cpu_percent=40, max_upload_kbps=500, only_when_idle=True, idle_minutes=2.5,
                    schedule="mon-fri 18:00-08:00, weekends")
    store.set_limits(limits)
    store.set_current(Current("http://example.org:8470", "other"))
    store.add_backbone("http://example.org:8470")
    store.paused = True
    store.qsettings.sync()
    again = SettingsStore()
    assert again.limits() == limits and again.paused and not again.first_run
    assert again.current() == Current("http://example.org:8470", "other")
    assert again.backbones() == ["http://example.org:8470"]


def test_measured_paces_in_a_hand_edited_settings_file_are_read_or_passed_over(home):
    store = SettingsStore()
    store.qsettings.setValue("rates", '[["a", "b", 1e999], ["a", "c", true], ["a", "d", ' + "9" * 400 + '], '
                             '["a", "e", "fast"], ["a", "f", 2.5], ["a", "g", -1], "junk", ["a", "h", NaN]]')
    assert store.rates() == {("a", "f"): 2.5}
    store.qsettings.setValue("rates", "not json")
    assert store.rates() == {}
    store.keep_rate("a", "b", 40.0)
    store.keep_rate("a", "b", 41.0)  # (within 5%: not written again)
    store.keep_rate("a", "b", float("inf"))
    assert store.rates() == {("a", "b"): 40.0}


def test_the_settings_page_shows_and_validates_every_limit(qtbot, home):
    controller = Controller(store=SettingsStore())
    controller.store.set_limits(Limits(threads=1, max_memory_mb=900, schedule="weekends"))
    page = SettingsPage(controller)
    qtbot.addWidget(page)
    assert page.threads.value() == 1 and page.max_memory.value() == 900
    assert page.schedule.text() == "weekends" and page.max_upload.value() is None
    page.idle_minutes.setValue(3)
    page.only_when_idle.setChecked(True)
    page.apply()
    assert controller.store.limits().only_when_idle and controller.store.limits().idle_minutes == 3
    page.schedule.setText("whenever")
    page.apply()
    assert "Not applied" in page.error.text() and controller.store.limits().schedule == "weekends"


def test_the_disk_limit_is_a_setting_and_downloads_show_on_the_dashboard(qtbot, home):
    controller = Controller(store=SettingsStore())
    controller.store.set_limits(Limits(max_disk_gb=2.5))
    settings = SettingsPage(controller)
    qtbot.addWidget(settings)
    assert settings.max_disk.value() == 2.5
    settings.max_disk.setValue(40)
    settings.apply()
    assert controller.store.limits().max_disk_gb == 40
    dashboard = DashboardPage(controller)
    qtbot.addWidget(dashboard)
    controller._on_event(p.Downloading(what="the project's shards/shard-00001.jsonl", received=3_000_000,
                                       total=12_000_000))
    assert dashboard.download.text() == "Downloading the project's shards/shard-00001.jsonl: 25% of 12.0 MB"
    controller._on_event(p.Downloading(what="the project's shards/shard-00001.jsonl", received=12_000_000,
                                       total=12_000_000))
    assert dashboard.download.text() == ""  # done: nothing more to say


def test_start_at_login_writes_and_removes_the_autostart_entry(qtbot, home):
    controller = Controller(store=SettingsStore())
    page = SettingsPage(controller)
    qtbot.addWidget(page)
    entry = home / ".config" / "autostart" / "cotrain.desktop"
    page.start_at_login.setChecked(True)
    wait_until(entry.exists, 10, "the autostart entry")
    text = entry.read_text()
    assert "[Desktop Entry]" in text and f"Exec={engine_command()[0]}" in text and autostart.is_enabled()
    assert text.split("Exec=")[1].splitlines()[0].endswith(" --background")
    assert SettingsStore().start_at_login
    page.start_at_login.setChecked(False)
    wait_until(lambda: not entry.exists(), 10, "the entry to go")


def test_adding_a_backbone_validates_the_address(qtbot, home, tmp_path):
    controller = Controller(store=SettingsStore())
    page = ProjectsPage(controller)
    qtbot.addWidget(page)
    page.url.setText("ftp://nowhere")
    page.add.click()
    wait_until(lambda: "not a backbone address" in page.error.text(), 10)
    page.url.setText("127.0.0.1:1")
    page.add.click()
    wait_until(lambda: "Nothing answers at 127.0.0.1:1" in page.error.text(), 15)
    assert "Errno" not in page.error.text() and "Connect call" not in page.error.text()
    with threaded_backbone(tmp_path / "backbone", tiny()) as backbone:
        page.url.setText(backbone.url + "/")
        page.add.click()
        wait_until(lambda: controller.store.backbones() == [backbone.url], 10)
        assert page.error.isHidden() and page.url.text() == ""
        wait_until(lambda: backbone.url in page.rows and page.rows[backbone.url].projects, 10)
        titles = [page.tree.topLevelItem(i).text(0) for i in range(page.tree.topLevelItemCount())]
        assert any(t.startswith("Tiny LM") for t in titles)
        row = next(i for i, t in enumerate(titles) if t.startswith("Tiny LM"))
        join = page.tree.itemWidget(page.tree.topLevelItem(row), 4)
        assert join.text() == "Join"
        join.click()
        assert controller.store.current() == Current(backbone.url, "tiny-lm")
        assert controller.state.reason == "Joining…"


def test_a_backbone_that_never_answers_does_not_hold_up_another(qtbot, home, tmp_path, monkeypatch):
    monkeypatch.setattr(backbone_calls, "TIMEOUT", 4.0)
    silent = socket.socket()  # accepts connections (the kernel does) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    silent_url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    client = BackboneCalls()
    stuck, answered = [], []
    try:
        with threaded_backbone(tmp_path / "backbone", tiny()) as backbone:
            for _ in range(backbone_calls.THREADS * 2):  # the Projects page refreshing, again and again
                client.projects(silent_url, None, stuck.append, stuck.append)
            began = time.monotonic()
            client.projects(backbone.url, None, answered.append, answered.append)
            wait_until(lambda: answered, 3, "the answering backbone")
            assert time.monotonic() - began < 3
            projects, _ = answered[0]
            assert [project.id for project in projects.projects] == ["tiny-lm"]
            assert not stuck  # still waiting on the silent one
            assert client.shutdown(8000)  # quitting waits for lookups running, up to their timeout
    finally:
        silent.close()
    wait_until(lambda: stuck, 2, "the silent backbone's answer")
    assert len(stuck) == 1 and stuck[0] == f"The backbone at {silent_url[7:]} does not answer."


def test_a_backbone_that_is_down_is_asked_again_after_growing_pauses(qtbot, home, monkeypatch):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()  # nothing listens there: every connection is refused at once
    controller = Controller(store=SettingsStore())
    controller.store.add_backbone(url)
    asked = []
    real = controller.client.projects
    monkeypatch.setattr(controller.client, "projects", lambda u, *a: (asked.append(u), real(u, *a)))
    page = ProjectsPage(controller)
    qtbot.addWidget(page)
    page.refresh()
    wait_until(lambda: url in page.rows and page.rows[url].error, 10, "the refusal")
    assert "trying again in" in page.rows[url].error
    first_pause = page._retry_at[url] - time.monotonic()
    page.refresh()  # the ten-second timer fires: the backbone is not asked again yet
    assert asked.count(url) == 1
    page.refresh(force=True)  # the user presses Refresh
    wait_until(lambda: asked.count(url) == 2 and page._retry_at[url] - time.monotonic() > first_pause,
               10, "a longer pause after the second refusal")


@pytest.mark.parametrize("answer", ["background", "quit", "cancel"])
def test_without_a_tray_closing_the_window_asks(qtbot, home, monkeypatch, answer):
    window = MainWindow(Controller(store=SettingsStore()), has_tray=False)
    qtbot.addWidget(window)
    window.show()
    monkeypatch.setattr(window, "ask_keep_running", lambda: answer)
    quits = []
    window.quit_requested.connect(lambda: quits.append(True))
    window.close()
    assert window.isVisible() == (answer == "cancel")
    assert bool(quits) == (answer == "quit")


def test_without_a_keyring_the_account_page_says_where_the_login_goes(qtbot, home):
    with keyring_backend(null.Keyring()):
        controller = Controller(store=SettingsStore())
        controller.store.set_current(Current("http://127.0.0.1:9", "tiny-lm"))
        page = AccountPage(controller)
        qtbot.addWidget(page)
        page.show()  # showing the page looks the login up
        wait_until(page.no_keyring.isVisible, 10, "the no-keyring note")
        assert "credentials.json" in page.no_keyring.text()
        assert "no system keyring is available" in page.no_keyring.text()


def test_a_second_instance_shows_the_first_one(qtbot, home):
    server = InstanceServer()
    try:
        messages = []
        server.message.connect(messages.append)
        assert ask_running_instance()
        wait_until(lambda: messages == ["show"], 5)
    finally:
        server.server.close()
    assert not ask_running_instance()


def test_a_socket_left_by_a_crashed_instance_is_taken_over_at_once(qtbot, home):
    server = InstanceServer()
    path = server.server.fullServerName()
    server.server.close()
    stale = socket.socket(socket.AF_UNIX)  # bound and never listening: what a crash leaves
    stale.bind(path)
    try:
        began = time.monotonic()
        assert not ask_running_instance()
        assert time.monotonic() - began < 1
        taken = InstanceServer()
        assert taken.server.isListening()
        taken.server.close()
    finally:
        stale.close()


def test_bad_command_lines_are_refused_with_the_reason():
    for bad, reason in (("", "not valid JSON"), ("[]", "object"), ('{"type": "explode"}', "explode"),
                        ('{"type": "start", "backbone": 5, "project": "x"}', "backbone"),
                        ('{"type": "snooze"}', "until"), ('{"type": "set_limits", "limits": {"threads": 0}}',
                                                           "threads")):
        with pytest.raises(ProtocolError, match=reason):
            p.commands.decode(bad)


async def test_the_worker_answers_a_bad_line_with_an_error_and_keeps_going(home):
    process = await asyncio.create_subprocess_exec(
        *engine_command(), "worker", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, env={**os.environ})
    assert process.stdin is not None and process.stdout is not None
    hello = p.events.decode(await asyncio.wait_for(process.stdout.readline(), 30))
    assert hello == p.Hello(version=p.VERSION, pid=process.pid)
    process.stdin.write(b"this is not json\n" + b'{"type":"set_limits","limits":{"cpu_percent":500}}\n')
    process.stdin.write(p.encode_line(p.Pause()))
    events = []
    while not any(isinstance(e, p.GovernorDecided) and e.state is GovernorState.PAUSED for e in events):
        events.append(p.events.decode(await asyncio.wait_for(process.stdout.readline(), 10)))
    errors = [e.message for e in events if isinstance(e, p.Problem)]
    assert any("not valid JSON" in m for m in errors) and any("cpu_percent" in m for m in errors)
    process.stdin.write(p.encode_line(p.Stop()))
    assert await asyncio.wait_for(process.wait(), 20) == 0


def test_backbones_announced_on_the_lan_are_offered_and_added(qtbot, home, tmp_path, monkeypatch):
    from engine.lan.advertise import Advertiser

    monkeypatch.setenv("COTRAIN_LAN_INTERFACES", "127.0.0.1")  # never mDNS on a real network
    controller = Controller(store=SettingsStore())
    page = ProjectsPage(controller)
    qtbot.addWidget(page)

    async def advertise(port: int) -> Advertiser:
        advertiser = Advertiser("127.0.0.1", port, {"tiny-lm": "Tiny LM"})
        await advertiser.start()
        return advertiser

    with threaded_backbone(tmp_path / "backbone", tiny()) as backbone:
        advertiser = backbone.call(advertise(int(backbone.url.rsplit(":", 1)[1])))
        try:
            page.refresh()
            wait_until(lambda: page.on_lan, 20, "the backbone to be discovered")
            assert page.lan_status.text() == "Announced on your network:"
            button = page.lan_buttons.itemAt(0).widget()
            assert "Tiny LM" in button.text() and button.toolTip() == backbone.url
            button.click()
            wait_until(lambda: controller.store.backbones() == [backbone.url], 10)
            wait_until(lambda: backbone.url in page.rows and page.rows[backbone.url].projects, 15)
            wait_until(lambda: not page.on_lan, 20, "the added backbone to leave the offers")
        finally:
            backbone.call(advertiser.stop())


def test_the_projects_page_says_what_a_project_takes_here_before_join(qtbot, home, tmp_path):
    """Download and disk, memory, and this computer's pace once it has been measured there,
    remembered across runs of the app."""
    shards = [FileRef(path=f"shards/{i}.txt", sha256="ab" * 32, bytes=1_500_000) for i in range(2)]
    project = msgspec.structs.replace(tiny(), data=DataSpec(shards=shards),
                                      needs=ProjectNeeds(parameters=3_300_000, memory_mb=712))
    with threaded_backbone(tmp_path / "backbone", project) as backbone:
        controller = Controller(store=SettingsStore())
        controller.add_backbone(backbone.url)
        page = ProjectsPage(controller)
        qtbot.addWidget(page)

        def takes() -> str:
            page.refresh(force=True)
            wait_until(lambda: backbone.url in page.rows and page.rows[backbone.url].projects, 10)
            titles = [page.tree.topLevelItem(i).text(0) for i in range(page.tree.topLevelItemCount())]
            (title,) = [t for t in titles if t.startswith("Tiny LM")]
            return title.splitlines()[-1]

        assert takes() == "Takes 3.0 MB to download and keep, about 712 MB of memory"
        controller.state.backbone, controller.state.project_id = backbone.url, project.id
        controller.manager.received.emit(p.Stats(
            samples_per_second=41.27, my_samples_session=64, my_samples_total=64, collab_samples=0,
            collab_target=64, eta_seconds=None, epoch=1, peers=1, upload_bps=0, download_bps=0, loss=None))
        assert takes().endswith("about 712 MB of memory, 41.3 samples/s here")
        controller.store.qsettings.sync()
        page = ProjectsPage(Controller(store=SettingsStore()))  # (the app started again)
        qtbot.addWidget(page)
        assert takes().endswith("41.3 samples/s here")
